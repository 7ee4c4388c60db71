"""Prompt templates: Jinja2 in its sandbox, loaded safely from a world's ``prompts/`` folder.

Instructions and inputs are templates rendered with ``ImmutableSandboxedEnvironment`` (a
template can read what it is given but not change it, nor reach Python internals) and
``StrictUndefined`` (a misspelt name is an error, never an empty string). A world's
``prompts/<name>`` overrides the built-in ``sim/prompts/<name>``; ``{% include %}`` and
``{% import %}`` resolve the same way, so a template can reach nothing outside ``prompts/``.

A world is untrusted input, so rendering is bounded in time and memory: every ``for`` loop
iteration and every call counts against a step budget and a deadline per render; no
operator, filter, method, format string, macro argument or ``namespace`` value can grow
past the output cap; ``lipsum`` is gone; the output itself is capped. Exceeding a bound is
a named error, never a hang. A world template that is a symlink or not a regular file is
refused, never replaced by the built-in of the same name.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from pathlib import Path
from types import TracebackType
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.lexer import Token, TokenStream
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from sim.errors import InputError
from sim.llm.calls import digest
from sim.phases.files import MissingFile, read_world_file, read_world_text

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "prompts"
PROMPTS = "prompts"
#: loop iterations plus calls allowed in one render
MAX_STEPS = 1_000_000
MAX_OUTPUT_CHARS = 400_000
MAX_SECONDS = 5.0
_GUARD = "_sim_guard"


class TemplateError(InputError):
    """A template that does not parse or render: names the file and the line."""

    def __init__(self, path: Path | str | None, line: int | None, problem: str) -> None:
        super().__init__(path, None, problem)
        self.line = line
        where = f"{self.path}:{line}" if line else str(self.path)
        self.args = (f"{where}: {problem}",)

    def __str__(self) -> str:
        return str(self.args[0])


class _Budget:
    """Steps and time left for the render in progress."""

    def __init__(self) -> None:
        self.steps = 0
        self.deadline = 0.0

    def reset(self) -> None:
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise SecurityError(f"template too costly: over {MAX_STEPS:,} loop steps and calls")
        if self.steps & 1023 == 0 and time.monotonic() > self.deadline:
            raise SecurityError(f"template took over {MAX_SECONDS:g}s to render")


class _GuardLoops(Extension):
    """Wraps the iterable of every ``{% for %}`` in ``_sim_guard(...)`` (a counting iterator),
    at the token level, so nested loops are bounded however they are written."""

    def filter_stream(self, stream: TokenStream) -> Iterable[Token]:
        in_for = False
        wrapped = False
        depth = 0
        previous: Token | None = None
        for token in stream:
            if token.type == "name" and token.value == "for" and previous is not None:
                in_for = previous.type == "block_begin"
                wrapped = False
            elif in_for and not wrapped and token.type == "name" and token.value == "in":
                yield token
                yield Token(token.lineno, "name", _GUARD)
                yield Token(token.lineno, "lparen", "(")
                wrapped, depth, previous = True, 0, token
                continue
            elif in_for and wrapped:
                if token.type in ("lparen", "lbracket", "lbrace"):
                    depth += 1
                elif token.type in ("rparen", "rbracket", "rbrace"):
                    depth -= 1
                ends = token.type == "block_end" or (
                    token.type == "name" and token.value in ("if", "recursive")
                )
                if depth == 0 and ends:
                    yield Token(token.lineno, "rparen", ")")
                    in_for = wrapped = False
            previous = token
            yield token


_BIG_WIDTH = re.compile(r"\d{7,}")


def _check_args(args: Iterable[Any]) -> None:
    """Refuse arguments that would make a huge value: a width or count over the output cap
    (``center(10**9)``, ``'x'.ljust(10**9)``), or a string already over it (a macro that
    doubles its argument each call)."""
    for arg in args:
        if isinstance(arg, bool):
            continue
        if isinstance(arg, int | float) and abs(arg) > MAX_OUTPUT_CHARS:
            raise SecurityError(f"a number too big for a template argument ({arg:.3g})")
        if isinstance(arg, str | list | tuple | dict) and len(arg) > MAX_OUTPUT_CHARS:
            raise SecurityError("a value too big for a template argument")


def _guarded(func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter with its arguments checked (``functools.wraps`` keeps Jinja's pass-arg
    marks, so context filters still get their context)."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _check_args(args)
        _check_args(kwargs.values())
        return func(*args, **kwargs)

    return guarded


class _BoundedNamespace(Namespace):
    """``namespace()`` whose values cannot grow past the output cap (a loop that doubles a
    string held in a namespace would otherwise exhaust memory before any step limit)."""

    def __setitem__(self, name: str, value: Any) -> None:
        _check_args((value,))
        super().__setitem__(name, value)


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, loader: jinja2.BaseLoader) -> None:
        super().__init__(
            loader=loader,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=False,
            extensions=[_GuardLoops],
            auto_reload=False,
        )
        self.budget = _Budget()
        self.globals[_GUARD] = self._guard
        self.globals["namespace"] = _BoundedNamespace
        self.globals.pop("lipsum", None)  # generates text by the megabyte on request
        self.filters = {name: _guarded(f) for name, f in self.filters.items()}

    def _guard(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.budget.step()
            yield item

    def call(
        __self,
        __context: jinja2.runtime.Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        __self.budget.step()
        _check_args(args)
        _check_args(kwargs.values())
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        if _BIG_WIDTH.search(value.__self__):
            raise SecurityError("a format width too big in a template")
        return wrapper

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        if operator == "**" and isinstance(right, int | float) and abs(right) > 64:
            raise SecurityError("exponent too big in a template")
        if operator == "%" and isinstance(left, str) and _BIG_WIDTH.search(left):
            raise SecurityError("a format width too big in a template")
        joined = operator == "+" and isinstance(left, str | list | tuple)
        if joined and isinstance(right, Sized) and len(left) + len(right) > MAX_OUTPUT_CHARS:
            raise SecurityError("a value too big in a template")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                big = isinstance(seq, str | list | tuple) and isinstance(n, int)
                if big and len(seq) * n > MAX_OUTPUT_CHARS:
                    raise SecurityError("a repeated value too big in a template")
        return super().call_binop(context, operator, left, right)


class _Loader(jinja2.BaseLoader):
    """Template names are paths inside ``prompts/``: the world's file, else the built-in."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: template name -> (file shown in errors, digest of its source)
        self.loaded: dict[str, tuple[str, str]] = {}

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str | None, Callable[[], bool] | None]:
        rel = f"{PROMPTS}/{template}"
        try:
            source = read_world_text(self.root, rel)
            filename = str(self.root / rel)
        except MissingFile:
            builtin = BUILTIN_DIR / template
            if "/" in template or not builtin.is_file():
                raise jinja2.TemplateNotFound(template) from None
            source = builtin.read_text(encoding="utf-8")
            filename = str(builtin)
        except InputError as exc:
            raise jinja2.TemplateNotFound(f"{template} ({exc.problem})") from None
        self.loaded[template] = (filename, digest(source.encode()))
        return source, filename, lambda: True


def template_name(rel: str, source: Path | None, field: str) -> str:
    """A config path (``prompts/opinion.md``) as a template name (``opinion.md``)."""
    prefix = f"{PROMPTS}/"
    if not rel.startswith(prefix) or ".." in rel.split("/") or "\\" in rel:
        raise InputError(source, field, f"templates live in the world's prompts/ (got {rel!r})")
    return rel[len(prefix) :]


def _line_of(tb: TracebackType | None, filenames: set[str]) -> tuple[str | None, int | None]:
    """The deepest template frame of a render error (Jinja rewrites tracebacks so that
    template frames carry the template's file name and line)."""
    found: tuple[str | None, int | None] = (None, None)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name in filenames:
            found = (name, tb.tb_lineno)
        tb = tb.tb_next
    return found


class Prompts:
    """The prompt templates of one world, compiled once, with the digests of those used.

    Args:
        root: the world folder (``prompts/`` inside it overrides the built-ins).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._loader = _Loader(root)
        self.env = _Sandbox(self._loader)
        self._cache: dict[str, jinja2.Template | None] = {}
        self._static: dict[str, bool] = {}

    def exists(self, name: str) -> bool:
        """Whether the world or sim has a template of this name."""
        return self.get(name, required=False) is not None

    def get(self, name: str, *, required: bool = True) -> jinja2.Template | None:
        """The compiled template, ``None`` if there is none and it is not ``required``.

        Raises:
            TemplateError: a syntax error (file and line), an unsafe or missing file.
        """
        if name in self._cache:
            template = self._cache[name]
        else:
            try:
                template = self.env.get_template(name)
            except jinja2.TemplateSyntaxError as exc:
                raise TemplateError(
                    exc.filename or self.root / PROMPTS / name, exc.lineno, exc.message or ""
                ) from None
            except jinja2.TemplateNotFound as exc:
                if not required and exc.name == name:
                    template = None
                else:
                    raise TemplateError(
                        self.root / PROMPTS / name, None, f"template not found: {exc.name}"
                    ) from None
            self._cache[name] = template
        if template is None and required:
            raise TemplateError(self.root / PROMPTS / name, None, "template not found")
        return template

    def render(self, name: str, context: Mapping[str, Any]) -> str:
        """Render a template with ``context``.

        Raises:
            TemplateError: an undefined name, a sandbox refusal or any other error, with
                the file and line where it happened.
        """
        template = self.get(name)
        assert template is not None
        self.env.budget.reset()
        try:
            parts: list[str] = []
            size = 0
            for chunk in template.generate(context):
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise SecurityError(f"output over {MAX_OUTPUT_CHARS:,} characters")
                parts.append(chunk)
            return "".join(parts).strip()
        except jinja2.TemplateSyntaxError as exc:  # in an included template
            raise TemplateError(exc.filename, exc.lineno, exc.message or "") from None
        except jinja2.TemplateNotFound as exc:
            file, line = _line_of(exc.__traceback__, self._filenames())
            raise TemplateError(
                file or template.filename, line, f"template not found: {exc.name}"
            ) from None
        except Exception as exc:  # UndefinedError, SecurityError, TypeError in an expression
            file, line = _line_of(exc.__traceback__, self._filenames())
            kind = "undefined name" if isinstance(exc, jinja2.UndefinedError) else "error"
            raise TemplateError(file or template.filename, line, f"{kind}: {exc}") from None

    def snapshot(self, names: Iterable[str], limit: int = 500) -> dict[str, str]:
        """Digests of the templates ``names`` (the world's, else the built-in, when there
        is one) and of every other file in the world's ``prompts/`` (partials it includes)."""
        for name in names:
            with contextlib.suppress(TemplateError):  # `sim check` names it; digest kept
                self.get(name, required=False)
        out = self.digests()
        folder = self.root / PROMPTS
        if folder.is_dir() and not folder.is_symlink():
            for base, dirs, files in os.walk(folder):
                dirs.sort()
                for file in sorted(files):
                    rel = Path(base, file).relative_to(folder).as_posix()
                    if rel in out or len(out) >= limit:
                        continue
                    try:
                        out[rel] = digest(read_world_file(self.root, f"{PROMPTS}/{rel}"))
                    except InputError:
                        continue  # a symlink or special file: never read, so never used
        return dict(sorted(out.items()))

    def _filenames(self) -> set[str]:
        return {filename for filename, _ in self._loader.loaded.values()}

    def digests(self) -> dict[str, str]:
        """Template name -> digest of its source, for every template loaded so far
        (includes too): what the tick log records and replay compares."""
        return {name: d for name, (_, d) in sorted(self._loader.loaded.items())}

    def is_static(self, name: str, names: frozenset[str]) -> bool:
        """Whether the template uses no variables outside ``names`` (rendered once a tick)."""
        known = self._static.get(name)
        if known is None:
            template = self.get(name)
            assert template is not None
            source, filename, _ = self._loader.get_source(self.env, name)
            used = meta.find_undeclared_variables(self.env.parse(source, name, filename))
            has_include = "{%" in source and ("include" in source or "import" in source)
            known = self._static[name] = used <= names | {_GUARD} and not has_include
        return known

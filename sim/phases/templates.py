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
import gc
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import jinja2
from jinja2 import meta, nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.lexer import Token, TokenStream
from jinja2.nodes import EvalContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from sim.errors import InputError
from sim.llm.calls import digest
from sim.phases.files import MissingFile, read_world_file, read_world_text
from sim.phases.template_limits import (
    MAX_INT_BITS,
    MAX_RENDER_CHARS,
    MAX_VALUE_CHARS,
    REARRANGING_FILTERS,
    SizedValue,
    check_args,
    filter_size,
    format_size,
    join_size,
    method_size,
    refuse_over,
    size,
)

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "prompts"
PROMPTS = "prompts"
#: loop iterations plus calls allowed in one render
MAX_STEPS = 1_000_000
MAX_OUTPUT_CHARS = MAX_VALUE_CHARS
MAX_SECONDS = 5.0
_GUARD = "_sim_guard"
_T = TypeVar("_T")


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
        self.chars = 0
        self.deadline = 0.0

    def reset(self) -> None:
        self.steps = 0
        self.chars = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def made(self, value: _T) -> _T:
        """Charge a string the render made to its budget of text; return it."""
        if isinstance(value, str):
            self.chars += len(value)
            if self.chars > MAX_RENDER_CHARS:
                raise SecurityError(
                    f"template too costly: it made over {MAX_RENDER_CHARS:,} characters of text"
                )
        return value

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
#: the values a filter is handed ahead of its input (``pass_context`` and the like)
_PASSED = (jinja2.runtime.Context, EvalContext, jinja2.Environment)


class _BoundedNamespace(Namespace, SizedValue):
    """``namespace()`` whose values cannot grow past the value cap in all (a loop that
    doubles a string held in a namespace, or sets a thousand names to one long string,
    would otherwise exhaust memory before any step limit)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self = args[0]
        initial = dict(*args[1:], **kwargs)
        check_args(initial.values(), "namespace()")
        Namespace.__init__(self, initial)
        self._sim_sizes = {name: size(value) for name, value in initial.items()}

    def __setitem__(self, name: str, value: Any) -> None:
        sizes: dict[str, int] = object.__getattribute__(self, "_sim_sizes")
        refuse_over(sum(sizes.values()) - sizes.get(name, 0) + size(value), "a namespace")
        sizes[name] = size(value)
        super().__setitem__(name, value)

    def text_size(self) -> int:
        sizes: dict[str, int] = object.__getattribute__(self, "_sim_sizes")
        return 16 + sum(sizes.values())


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator with ``~`` sent through the sandbox's measured join (the
    sandbox has no hook for it: ``{% set x = x ~ x %}`` doubles a string per line)."""

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.measured_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CodeGenerator

    def __init__(self, loader: jinja2.BaseLoader) -> None:
        super().__init__(
            loader=loader,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=False,
            extensions=[_GuardLoops],
            auto_reload=False,
            finalize=self._finalize,
        )
        self.budget = _Budget()
        self.globals[_GUARD] = self._guard
        self.globals["namespace"] = _BoundedNamespace
        self.globals.pop("lipsum", None)  # generates text by the megabyte on request
        self.filters = {name: self._guarded(name, f) for name, f in self.filters.items()}

    def _guarded(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        """A filter with its arguments measured, its result estimated before it is made
        when it can multiply its input, and charged to the render's budget after
        (``functools.wraps`` keeps Jinja's pass-arg marks, so context filters still get
        their context)."""

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            lead = 0
            while lead < len(args) and isinstance(args[lead], _PASSED):
                lead += 1
            passed, rest = args[:lead], list(args[lead:])
            if name == "join" and rest and not isinstance(rest[0], str | list):
                rest[0] = list(rest[0])  # a generator, measured as it will be joined
            text = name not in REARRANGING_FILTERS  # a plugin's filter is measured
            check_args([*rest, *kwargs.values()], f"the filter {name}", text=text)
            estimate = filter_size(name, rest, kwargs)
            if estimate is not None:
                refuse_over(estimate, f"the filter {name}")
            return self.budget.made(func(*passed, *rest, **kwargs))

        return guarded

    def _guard(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.budget.step()
            yield item

    def _finalize(self, value: Any) -> Any:
        refuse_over(size(value), "an output expression")
        return value

    def concat(self, parts: Iterable[str]) -> str:
        """The body of a block, a macro or ``{% set %}``, joined once its length is known."""
        chunks = list(parts)
        refuse_over(sum(len(chunk) for chunk in chunks), "a block's body")
        return self.budget.made("".join(chunks))

    def measured_concat(self, values: Iterable[Any]) -> str:
        """``a ~ b``: measured, then joined."""
        items = list(values)
        refuse_over(join_size(items, ""), "the operator ~")
        return self.budget.made("".join(str(item) for item in items))

    def call(
        __self,
        __context: jinja2.runtime.Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        __self.budget.step()
        owner = getattr(__obj, "__self__", None)
        method = getattr(__obj, "__name__", "")
        if isinstance(owner, str) and method == "join" and args:
            args = (list(args[0]), *args[1:])
        # a macro, a loop's guard, a method: their arguments are passed on, not made text
        # here (a str method that makes text is estimated below; `~` and bodies measure)
        check_args([*args, *kwargs.values()], f"{method or 'a call'}()", text=False)
        if isinstance(owner, str):
            estimate = method_size(owner, method, list(args), kwargs)
            if estimate is not None:
                refuse_over(estimate, f"str.{method}()")
        return __self.budget.made(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        text: str = value.__self__
        if _BIG_WIDTH.search(text):
            raise SecurityError("a format width too big in a template")
        method: str = value.__name__

        @functools.wraps(wrapper)
        def measured(*args: Any, **kwargs: Any) -> str:
            estimate = method_size(text, method, list(args), kwargs)
            refuse_over(estimate or 0, f"str.{method}()")
            return self.budget.made(wrapper(*args, **kwargs))

        return measured

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        if operator == "**" and isinstance(right, int | float) and abs(right) > 64:
            raise SecurityError("exponent too big in a template")
        if operator in ("*", "**") and isinstance(left, int) and isinstance(right, int):
            bits = left.bit_length() + right.bit_length()
            if operator == "**":
                bits = left.bit_length() * abs(right)
            if bits > MAX_INT_BITS:
                raise SecurityError(f"a number over {MAX_INT_BITS:,} bits in a template")
        if operator == "%" and isinstance(left, str):
            if _BIG_WIDTH.search(left):
                raise SecurityError("a format width too big in a template")
            refuse_over(format_size(left, right, left.count("%")), "the operator %")
        if operator == "+" and isinstance(left, str | list | tuple):
            refuse_over(size(left) + size(right), "the operator +")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int):
                    refuse_over(size(seq) * n, "the operator *")
        return self.budget.made(super().call_binop(context, operator, left, right))


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
        except MemoryError as exc:  # a bound this sandbox missed: still a named error
            file, line = _line_of(exc.__traceback__, self._filenames())
            error = TemplateError(file or template.filename, line, "error: out of memory")
        except Exception as exc:  # every failure becomes a TemplateError
            error = self._render_error(exc, template.filename)
        # A failed render's traceback (rewritten by Jinja) is a reference cycle holding
        # its frames and whatever they had built, up to the budget: free it now, not at
        # the next collection, or `sim check` rendering for every character keeps them all.
        gc.collect()
        raise error

    def _render_error(self, exc: Exception, filename: str | None) -> TemplateError:
        """The error of a failed render, with the file and line where it happened."""
        if isinstance(exc, jinja2.TemplateSyntaxError):  # in an included template
            return TemplateError(exc.filename, exc.lineno, exc.message or "")
        file, line = _line_of(exc.__traceback__, self._filenames())
        if isinstance(exc, jinja2.TemplateNotFound):
            return TemplateError(file or filename, line, f"template not found: {exc.name}")
        # UndefinedError, SecurityError, TypeError in an expression
        kind = "undefined name" if isinstance(exc, jinja2.UndefinedError) else "error"
        problem = str(exc) or type(exc).__name__
        return TemplateError(file or filename, line, f"{kind}: {problem}")

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

"""Size bounds for the template sandbox: what a value would weigh as text, before it is made.

A world's templates are untrusted, and Jinja's sandbox bounds what a template may reach, not
how much memory it may fill: ``range(5000)|join('x' * 300000)`` asks for 1.5 GB in one call.
The sandbox (``sim.phases.templates``) asks this module, before each operation that makes
text (an operator, ``~``, a filter, a string method, a block's body, an output expression),
how long the result could be, and refuses the operation when the answer is over
``MAX_VALUE_CHARS``; each string a render makes is also charged to ``MAX_RENDER_CHARS``, the
text one render may make in all. Estimates are upper bounds computed from the inputs' sizes,
never by building the result. The walk over a value stops as soon as it passes its limit,
so measuring costs at most as much as the limit, however the value is shared or nested.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.nodes import EvalContext
from jinja2.runtime import Context, Undefined

#: the longest value (as text) a template may make or pass on: the output cap
MAX_VALUE_CHARS = 400_000
#: the characters of text one render may make in all (operators, filters, calls, bodies)
MAX_RENDER_CHARS = 20_000_000
#: the largest integer a template may make, in bits (``10 ** 64`` is 213)
MAX_INT_BITS = 4_096

_NUMBERS = re.compile(r"\d+")


def size(value: Any, limit: int = MAX_VALUE_CHARS) -> int:
    """An upper estimate of ``len(str(value))``, stopping once it passes ``limit``.

    Containers count their items (and their quotes and commas), shared items once per
    reference, as ``str()`` would write them.
    """
    total = 0
    stack = [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        elif isinstance(item, float):
            total += 24
        elif isinstance(item, bytes | bytearray):
            total += 4 * len(item) + 3
        elif isinstance(item, range):
            total += 48  # "range(0, 10)": joined or listed, its items are measured then
        elif isinstance(item, Mapping):
            total += 2 + 6 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + 4 * len(item)
            stack.extend(item)
        elif isinstance(item, SizedValue):
            total += item.text_size()
        elif isinstance(item, Undefined | Context | EvalContext):
            total += 1
        else:
            total += 64  # an object from the context, a function, a generator: named by repr
    return total


class SizedValue:
    """A value that keeps its own size (the sandbox's ``namespace``)."""

    def text_size(self) -> int:
        """An upper estimate of the value's length as text."""
        raise NotImplementedError


def refuse_over(estimate: int, what: str) -> None:
    """Refuse an operation whose result could be longer than ``MAX_VALUE_CHARS``."""
    if estimate > MAX_VALUE_CHARS:
        raise SecurityError(
            f"{what} could make a value of {estimate:,} characters, over the template "
            f"limit of {MAX_VALUE_CHARS:,}"
        )


def check_args(args: Iterable[Any], what: str = "a template call", *, text: bool = True) -> None:
    """Refuse arguments that would make a huge value: a width or count over the value cap
    (``center(10**9)``, ``'x'.ljust(10**9)``), a string or sequence longer than it, and,
    when the callee makes ``text`` of them (``string``, ``tojson``, ``upper`` on a list),
    arguments over it in all as text (a list holding one long string a thousand times).

    A callee that only rearranges its arguments (``sort``, ``selectattr``, a macro, a
    loop) is given ``text=False``: a large cast passes through it, and whatever later
    makes text of the result is measured then.
    """
    total = 0
    for arg in args:
        if isinstance(arg, bool):
            continue
        if isinstance(arg, int | float) and abs(arg) > MAX_VALUE_CHARS:
            raise SecurityError(f"a number too big for a template argument ({arg:.3g})")
        if isinstance(arg, str | list | tuple | dict) and len(arg) > MAX_VALUE_CHARS:
            raise SecurityError(f"a value too big for an argument of {what}")
        if not text:
            continue
        total += size(arg, MAX_VALUE_CHARS - total)
        if total > MAX_VALUE_CHARS:
            raise SecurityError(
                f"arguments of {what} over the template limit of {MAX_VALUE_CHARS:,} characters"
            )


#: Jinja's built-in filters that never make text of their input (they count, pick,
#: sort or regroup it): their arguments are not measured as text
REARRANGING_FILTERS = frozenset(
    {
        "abs", "attr", "batch", "count", "d", "default", "dictsort", "first", "float",
        "groupby", "int", "items", "last", "length", "list", "map", "max", "min", "random",
        "reject", "rejectattr", "reverse", "round", "select", "selectattr", "slice", "sort",
        "unique",
    }
)  # fmt: skip


def _largest_int(values: Iterable[Any]) -> int:
    ints = [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return max(ints, default=0)


def format_size(fmt: str, args: Any, fields: int) -> int:
    """Upper bound of ``fmt % args`` or ``fmt.format(*args)``: every field could write all of
    the arguments, at the widest width written in the format or passed as an argument."""
    flat = list(args) if isinstance(args, tuple | list) else [args]
    if isinstance(args, Mapping):
        flat = list(args.values())
    widths = sum(int(n) for n in _NUMBERS.findall(fmt) if len(n) < 12)
    if any(len(n) >= 12 for n in _NUMBERS.findall(fmt)):
        widths = MAX_VALUE_CHARS + 1
    return len(fmt) + widths + fields * (size(args) + _largest_int(flat))


def join_size(items: list[Any], separator: Any) -> int:
    """Upper bound of ``separator.join(map(str, items))``."""
    total = size(separator) * max(len(items) - 1, 0)
    for item in items:
        if total > MAX_VALUE_CHARS:
            break
        total += size(item, MAX_VALUE_CHARS - total)
    return total


def replace_size(text: str, old: str, new: str, count: int | None) -> int:
    """Upper bound of ``text.replace(old, new, count)``, counted without replacing."""
    hits = text.count(old) if old else len(text) + 1
    if count is not None and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(len(new) - len(old), 0)


def lines_size(text: str, per_line: int) -> int:
    """Upper bound of ``text`` with ``per_line`` characters added at each line (``indent``)."""
    return len(text) + (text.count("\n") + 1) * per_line


def wrap_size(text: str, width: int, wrapstring: str) -> int:
    """Upper bound of ``wordwrap``: a break at most every ``width`` characters or word."""
    breaks = len(text) // max(width, 1) + len(text.split()) + text.count("\n") + 1
    return len(text) + breaks * len(wrapstring)


def check_int(value: Any) -> None:
    """Refuse an integer too long to be text (Python refuses to print one over 4,300 digits
    only after it has been computed)."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise SecurityError(f"a number over {MAX_INT_BITS:,} bits in a template")


def _arg(args: list[Any], kwargs: Mapping[str, Any], i: int, name: str, default: Any) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def filter_size(name: str, args: list[Any], kwargs: Mapping[str, Any]) -> int | None:
    """Upper bound of the text a built-in filter that multiplies its input would make
    (``args[0]`` is the filtered value); ``None`` for the others, whose result is a small
    multiple of their arguments, already bounded."""
    if not args:
        return None
    value = args[0]
    text = value if isinstance(value, str) else ""
    if name == "join":
        items = value if isinstance(value, list) else []
        return join_size(items, _arg(args, kwargs, 1, "d", ""))
    if name == "format":
        fmt = str(value)
        rest = dict(kwargs) if kwargs else tuple(args[1:])
        return format_size(fmt, rest, fmt.count("%"))
    if name == "replace":
        old, new = str(_arg(args, kwargs, 1, "old", "")), str(_arg(args, kwargs, 2, "new", ""))
        count = _arg(args, kwargs, 3, "count", None)
        return replace_size(str(value), old, new, count if isinstance(count, int) else None)
    if name == "indent":
        width = _arg(args, kwargs, 1, "width", 4)
        per_line = width if isinstance(width, int) else size(width)
        return lines_size(str(value), per_line)
    if name == "wordwrap":
        wrapstring = _arg(args, kwargs, 3, "wrapstring", None) or "\n"
        width = _int(_arg(args, kwargs, 1, "width", 79), 79)
        return wrap_size(str(value), width, str(wrapstring))
    if name == "center":
        return len(text) + _int(_arg(args, kwargs, 1, "width", 80), 0)
    return None


def method_size(text: str, method: str, args: list[Any], kwargs: Mapping[str, Any]) -> int | None:
    """Upper bound of ``text.method(*args, **kwargs)`` for the ``str`` methods that can
    make more than a small multiple of their inputs; ``None`` for the others."""
    if method == "join":
        return join_size(args[0] if args and isinstance(args[0], list) else [], text)
    if method == "replace" and len(args) >= 2:
        count = _arg(args, kwargs, 2, "count", None)
        return replace_size(text, str(args[0]), str(args[1]), count)
    if method == "expandtabs":
        return len(text) + text.count("\t") * _int(_arg(args, kwargs, 0, "tabsize", 8), 8)
    if method in ("format", "format_map"):
        rest = args[0] if method == "format_map" and args else (tuple(args), dict(kwargs))
        return format_size(text, rest, text.count("{"))
    return None

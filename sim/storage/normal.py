"""A world file's normal form, without pydantic's dump when the file is close to it.

Loading validates each file with its model (``sim.world``) and keeps the model's dump,
``model_dump(by_alias=True)``: known fields first in order, defaults filled, the optional
fields the serializers drop while ``None`` left out, a float field's ``1`` as ``1.0``,
fields of the world's own after them. What a commit writes is mostly that form already,
and the models' objects and their dump were about half of a big world's load.
``normal_form`` instead:

- validates with plain dicts (``_fast_validator``: a ``TypedDict`` per model, built from
  its fields with the same types and constraints, every field required but the ones the
  dump drops while ``None``, which are never ``None`` there): it accepts only what the
  model accepts, at half the cost of building the model's objects;
- returns the parsed file itself when it is laid out as the normal form (``_is_normal``:
  each model's keys in order, its own fields after them, each float field a float): strict
  validation converts nothing else (``_shape`` refuses a model with a validator, a
  serializer other than the dropping ones, a transforming constraint, a lax config or a
  type it does not know), and the dump writes every other value as it was given;
- else rebuilds it in order (``_reordered``): what the engine writes after adding a key
  to an entity (a memory's archive after its plan, an inbox after a field of the world's).

Anything else (a file with a default left out, written by hand or by an older engine, or
a field's name given for its alias) goes through the model and its dump as before, and an
invalid file's errors are the model's own.

A commit puts each changed entity in normal form first (``normal_order``, from
``Storage.changed_files``): the keys a tick appended to a dict it holds (a memory's
``unreflected`` after its plan, its ``archive`` after both, an inbox or relationships
after ``_openai``) are moved to their places, in place, so that what a tick writes is the
normal form and the next load keeps it as parsed, instead of rebuilding it and the next
commit rewriting a file nothing changed.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from sim.world import DROPPED_WHEN_NONE, Character, Location, WorldMeta

__all__ = ["normal_form", "normal_order"]

# how a field's value is checked to be as the dump writes it
_PLAIN = 0  # str, int, bool, lists and str-keyed dicts of them: strict validation keeps them
_FLOAT = 1  # strict validation turns an int into a float: the dump writes 1.0 for 1
_MODEL = 2  # a nested model
_MODELS = 3  # a list of models
_MODEL_MAP = 4  # a str-keyed dict of models
#: StringConstraints that change the text (a value would differ from its dump)
_TRANSFORMS = ("strip_whitespace", "to_upper", "to_lower")


class _Unvouched(TypeError):
    """A model or type the check cannot vouch for (raised on import: a new field of a kind
    it does not know must be taught to it, never slip through unchecked)."""


@dataclass(frozen=True)
class _Shape:
    """What a model's dump looks like, for ``_is_normal`` and ``_reordered``."""

    #: the key orders of a normal dict without fields of its own: every field's key in
    #: order, less any of the dropped ones
    layouts: frozenset[tuple[str, ...]]
    #: every name a field may be given in the input (name, alias)
    names: frozenset[str]
    #: (key, how its value is checked, its model's shape), for the fields whose value
    #: needs a look
    checks: tuple[tuple[str, int, _Shape | None], ...]
    #: (key, how its value is checked, its model's shape) for every field, in order
    fields: tuple[tuple[str, int, _Shape | None], ...]
    #: what ``_order`` looks at: ``checks`` less the lists and maps of models with no
    #: checks of their own (cells, messages), as float fields' keys, (key, shape) of
    #: nested models, and (key, _MODELS or _MODEL_MAP, shape) of lists and maps of models
    branches: tuple[tuple[str, int, _Shape | None], ...]
    floats: tuple[str, ...]
    models: tuple[tuple[str, _Shape], ...]
    lists: tuple[tuple[str, int, _Shape], ...]
    #: ``_own_layout``'s verdict on each key order met with fields of its own (an entity's
    #: ``_openai``: the same few orders over and over), up to ``_SEEN`` of them
    seen: dict[tuple[str, ...], bool] = field(default_factory=dict, compare=False)


#: the most key orders with fields of their own a shape remembers its verdict on, and
#: the longest (in characters, all its keys) it remembers: a long-lived process (``sim
#: serve``, a sweep) holds no more than a few megabytes of them, whatever its worlds' keys
_SEEN = 4096
_SEEN_CHARS = 512
_SHAPES: dict[type[BaseModel], _Shape] = {}
_PLAIN_DICTS: dict[type[BaseModel], Any] = {}
_VALIDATORS: dict[type[BaseModel], TypeAdapter[Any]] = {}


def _converts(meta: Any) -> bool:
    """Whether a constraint may change a value: text transformed, or lax validation (a
    ``Field()`` inside ``Annotated`` holds its constraints in its ``metadata``)."""
    inner = getattr(meta, "metadata", None)
    if isinstance(inner, list) and any(_converts(m) for m in inner):
        return True
    return getattr(meta, "strict", None) is False or any(
        getattr(meta, name, None) for name in _TRANSFORMS
    )


def _strip(annotation: Any) -> Any:
    """An annotation without ``Annotated`` and ``| None`` (refusing a converting
    constraint or a union of types)."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            args = get_args(annotation)
            if any(_converts(meta) for meta in args[1:]):
                raise _Unvouched(f"{annotation}: a converting constraint")
            annotation = args[0]
        elif origin in (Union, types.UnionType):
            args = tuple(a for a in get_args(annotation) if a is not type(None))
            if len(args) != 1:
                raise _Unvouched(f"{annotation}: a union")
            annotation = args[0]
        else:
            return annotation


def _classify(annotation: Any) -> tuple[int, _Shape | None]:
    """How a value of ``annotation`` is checked."""
    bare = _strip(annotation)
    if isinstance(bare, type) and issubclass(bare, BaseModel):
        return _MODEL, _shape(bare)
    if bare is float:
        return _FLOAT, None
    if bare in (str, int, bool):
        return _PLAIN, None
    origin, args = get_origin(bare), get_args(bare)
    if origin is list and len(args) == 1:
        kind, sub = _classify(args[0])
        if kind == _PLAIN:
            return _PLAIN, None
        if kind == _MODEL:
            return _MODELS, sub
    if origin is dict and len(args) == 2 and _classify(args[0])[0] == _PLAIN:
        kind, sub = _classify(args[1])
        if kind == _PLAIN:
            return _PLAIN, None
        if kind == _MODEL:
            return _MODEL_MAP, sub
    raise _Unvouched(f"{annotation}: not a type the normal-form check knows")


def _vouch(model: type[BaseModel]) -> None:
    """Refuse a model whose validation may convert a value or whose dump may change one."""
    config = model.model_config
    decorators = model.__pydantic_decorators__
    if (
        config.get("strict") is not True
        or config.get("extra") != "allow"
        or any(config.get(k) for k in ("str_strip_whitespace", "str_to_lower", "str_to_upper"))
        or model.model_computed_fields
        or decorators.field_serializers
        or decorators.validators
        or decorators.field_validators
        or decorators.model_validators
        or (decorators.model_serializers and model not in DROPPED_WHEN_NONE)
    ):
        raise _Unvouched(f"{model.__name__}: the normal-form check cannot vouch for it")
    for name, info in model.model_fields.items():
        if (
            info.exclude
            or info.discriminator is not None
            or info.validation_alias not in (None, info.alias)
            or info.serialization_alias not in (None, info.alias)
            or any(_converts(meta) for meta in info.metadata)
        ):
            raise _Unvouched(f"{model.__name__}.{name}: the normal-form check cannot vouch for it")


def _shape(model: type[BaseModel]) -> _Shape:
    """``model``'s shape, built once."""
    known = _SHAPES.get(model)
    if known is not None:
        return known
    _vouch(model)
    dropped = DROPPED_WHEN_NONE.get(model, ())
    keys: dict[str, str] = {}  # field name -> its key in the dump
    names: set[str] = set()
    fields: list[tuple[str, int, _Shape | None]] = []
    for name, info in model.model_fields.items():
        alias = info.alias or name
        keys[name] = alias
        names.update((name, alias))
        kind, sub = _classify(info.annotation)
        fields.append((alias, kind, sub))
    layouts = {tuple(keys.values())}
    for name in dropped:  # every subset of the dropped fields left out
        layouts |= {tuple(k for k in layout if k != keys[name]) for layout in layouts}
    checks = tuple(f for f in fields if f[1] != _PLAIN)
    branches = tuple(
        f for f in checks if f[1] in (_FLOAT, _MODEL) or (f[2] is not None and f[2].checks)
    )
    shape = _Shape(
        frozenset(layouts),
        frozenset(names),
        checks,
        tuple(fields),
        branches,
        floats=tuple(key for key, kind, _ in branches if kind == _FLOAT),
        models=tuple(
            (key, sub) for key, kind, sub in branches if kind == _MODEL and sub is not None
        ),
        lists=tuple(
            (key, kind, sub) for key, kind, sub in branches if kind > _MODEL and sub is not None
        ),
    )
    _SHAPES[model] = shape
    return shape


def _own_layout(shape: _Shape, keys: tuple[str, ...]) -> bool:
    """Whether ``keys``, not one of ``shape.layouts``, are such a layout with fields of
    the world's own after it (remembered: a world's entities share a few such orders)."""
    verdict = shape.seen.get(keys)
    if verdict is not None:
        return verdict
    names = shape.names
    known = 0
    for key in keys:
        if key not in names:
            break
        known += 1
    verdict = keys[:known] in shape.layouts and not any(key in names for key in keys[known:])
    if len(shape.seen) < _SEEN and sum(map(len, keys)) <= _SEEN_CHARS:
        shape.seen[keys] = verdict
    return verdict


def _is_normal(shape: _Shape, data: dict[str, Any]) -> bool:
    """Whether ``data`` (parsed JSON, not yet validated) is laid out as the normal form of
    the model of ``shape``: valid for its plain validator too (which refuses ``None`` for
    a field the dump drops while ``None``), it is that form, key order included."""
    keys = tuple(data)
    if keys not in shape.layouts and not _own_layout(shape, keys):
        return False
    for key, kind, sub in shape.checks:
        value = data.get(key)
        if value is None:  # absent (a dropped field), or left to the validator
            continue
        if kind == _FLOAT:
            if type(value) is not float:
                return False
        elif kind == _MODEL:
            if type(value) is not dict or not _is_normal(sub, value):  # type: ignore[arg-type]
                return False
        else:
            items: Any
            if kind == _MODELS and type(value) is list:
                items = value
            elif kind == _MODEL_MAP and type(value) is dict:
                items = value.values()
            else:
                return False
            assert sub is not None
            if sub.checks:
                for item in items:
                    if type(item) is not dict or not _is_normal(sub, item):
                        return False
            else:  # a cell: its keys only
                for item in items:
                    if type(item) is not dict:
                        return False
                    keys = tuple(item)
                    if keys not in sub.layouts and not _own_layout(sub, keys):
                        return False
    return True


def _order(shape: _Shape, data: dict[str, Any]) -> int | None:
    """Put ``data``, a dict the engine holds, in the normal form of ``shape``'s model, in
    place: each dict's known keys in order before its own (the values moved, not copied),
    an integer of a float field as a float; how many dicts and values it changed (0: it
    was in order), or ``None`` when only the model can tell (a field given by its name,
    not its key; a value of the wrong type). Not validated, and the items of a list of
    models with no field to check (cells, a plan's items, messages: each built whole, in
    order) are not looked at: it costs less than the dump it precedes."""
    changed = 0
    keys = tuple(data)
    if keys not in shape.layouts and not _own_layout(shape, keys):
        known = [key for key, _, _ in shape.fields if key in data]
        own = [key for key in keys if key not in shape.names]
        if len(known) + len(own) != len(keys):
            return None
        for key in (*known, *own):
            data[key] = data.pop(key)
        changed += 1
    for key in shape.floats:
        value = data.get(key)
        if value is None or type(value) is float:
            continue
        if type(value) is not int or not -_EXACT_FLOAT <= value <= _EXACT_FLOAT:
            return None
        data[key] = float(value)
        changed += 1
    for key, sub in shape.models:
        value = data.get(key)
        if value is None:
            continue
        if type(value) is not dict:
            return None
        if sub.branches or (
            (keys := tuple(value)) not in sub.layouts and not _own_layout(sub, keys)
        ):
            done = _order(sub, value)
            if done is None:
                return None
            changed += done
    for key, many, sub in shape.lists:
        value = data.get(key)
        if value is None:
            continue
        if many == _MODELS:
            if type(value) is not list:
                return None
            items: Any = value
        elif type(value) is dict:
            items = value.values()
        else:
            return None
        for item in items:
            if type(item) is not dict:
                return None
            done = _order(sub, item)
            if done is None:
                return None
            changed += done
    return changed


#: the integers a float field's value may be rebuilt from (``float(i)`` exact), else the dump
_EXACT_FLOAT = 2**53


def _reordered(shape: _Shape, data: dict[str, Any]) -> dict[str, Any] | None:
    """The normal form of ``data``, valid for the plain validator of ``shape``'s model,
    built from it: its fields' keys in order (each present but a dropped one, which is
    never ``None`` there), integers of a float field as floats, its own fields after; or
    ``None`` when a field's name is given in place of its key (``from_``): the model
    decides. What the engine writes after adding a key to an entity (a cell's archive
    after its plan, an inbox after a field of the world's own) takes this path."""
    out: dict[str, Any] = {}
    for key, kind, sub in shape.fields:
        if key not in data:
            continue
        value = data[key]
        if value is None or kind == _PLAIN:
            pass
        elif kind == _FLOAT:
            if type(value) is int and -_EXACT_FLOAT <= value <= _EXACT_FLOAT:
                value = float(value)
            elif type(value) is not float:
                return None
        else:
            assert sub is not None
            if kind == _MODEL:
                value = _reordered(sub, value)
            elif kind == _MODELS:
                value = [_reordered(sub, item) for item in value]
            else:
                value = {k: _reordered(sub, item) for k, item in value.items()}
            if value is None or (kind == _MODELS and None in value):
                return None
            if kind == _MODEL_MAP and None in value.values():
                return None
        out[key] = value
    names = shape.names
    for key, value in data.items():
        if key not in names:
            out[key] = value
        elif key not in out:
            return None
    return out


def _without_none(annotation: Any) -> Any:
    """``X | None`` as ``X``."""
    args = tuple(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) not in (Union, types.UnionType) or len(args) != 1:
        raise _Unvouched(f"{annotation}: a field left out while None must be X | None")
    return args[0]


def _as_plain(annotation: Any) -> Any:
    """``annotation`` with each model in it replaced by its ``TypedDict``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _plain_dict(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return Annotated[(_as_plain(args[0]), *args[1:])]
    if origin in (Union, types.UnionType):
        return Union[tuple(_as_plain(a) for a in args)]  # noqa: UP007 (built from a tuple)
    generic: Any = origin
    if origin is list:
        return generic[_as_plain(args[0])]
    if origin is dict:
        return generic[args[0], _as_plain(args[1])]
    return annotation


def _plain_dict(model: type[BaseModel]) -> Any:
    """A ``TypedDict`` of ``model``'s fields by their keys, under its config, each of the
    same type and constraints: every field required but the dropped ones, which may be
    left out but are never ``None`` (a dict of that layout is what ``_is_normal`` passes)."""
    known = _PLAIN_DICTS.get(model)
    if known is not None:
        return known
    dropped = DROPPED_WHEN_NONE.get(model, ())
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation = _as_plain(
            _without_none(info.annotation) if name in dropped else info.annotation
        )
        if info.metadata:
            annotation = Annotated[(annotation, *info.metadata)]
        fields[info.alias or name] = NotRequired[annotation] if name in dropped else annotation
    config = ConfigDict(strict=True, extra="allow")
    plain = with_config(config)(TypedDict(f"{model.__name__}Dict", fields))  # type: ignore[operator]
    _PLAIN_DICTS[model] = plain
    return plain


def _fast_validator(model: type[BaseModel]) -> TypeAdapter[Any]:
    known = _VALIDATORS.get(model)
    if known is None:
        known = _VALIDATORS[model] = TypeAdapter(_plain_dict(model))
    return known


def normal_form(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` validated by ``model`` and normalised: what
    ``model.model_validate(data).model_dump(by_alias=True)`` gives, ``data`` itself when
    it already is that. ``data`` is parsed JSON the caller hands over.

    Raises:
        ValidationError: ``data`` is not valid for ``model`` (the model's own errors).
    """
    shape = _shape(model)
    try:
        _fast_validator(model).validate_python(data)
    except ValidationError:
        pass  # not valid, or valid with a default or a field by name: the model decides
    else:
        if _is_normal(shape, data):
            return data
        reordered = _reordered(shape, data)
        if reordered is not None:
            return reordered
    normal: dict[str, Any] = model.model_validate(data).model_dump(by_alias=True)
    return normal


def normal_order(model: type[BaseModel], data: dict[str, Any]) -> bool:
    """Put ``data``, an entity the engine holds (in normal form when it was loaded,
    changed since by a tick's phases or an intervention), in normal form for its commit,
    in place (``_order``: the keys a phase appended moved to their places, an integer of
    a float field made a float; else the model's dump in its place); whether anything
    changed. Data the model refuses is left as it is, for the next load to name.
    """
    done = _order(_shape(model), data)
    if done is not None:
        return done > 0
    try:
        normal = model.model_validate(data).model_dump(by_alias=True)
    except ValidationError:
        return True  # perhaps partly reordered: dumped again, as it is
    data.clear()
    data.update(normal)
    return True


for _model in (WorldMeta, Character, Location):  # a model the check cannot vouch for fails here
    _shape(_model)

"""``sim.storage.normal.normal_form``: the load's normal form, with pydantic's dump
skipped when the input already is it, must equal ``model_validate(data).model_dump(
by_alias=True)`` for every input, key order and number types included, and refuse
exactly what the model refuses.

Each test compares the two on many inputs: a world file in normal form with every
optional field, and every variant of it one edit away (a key left out, set to ``null``,
renamed, an unknown key put at each place, a dict's keys reversed, a value of the wrong
type or range, a float written as an integer, ``from`` spelt ``from_``). A fast path that
kept an input the dump would change, or took one the model refuses, fails here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import orjson
import pytest
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from sim.storage import normal
from sim.storage.normal import normal_form, normal_order
from sim.world import Character, Location, WorldMeta

CELL = {"tick": 3, "text": "Ada said hello.", "importance": 4, "mentions": ["ada"], "sources": [1]}
CHARACTER: dict[str, Any] = {
    "identity": {
        "id": "bo",
        "name": "Bo",
        "description": "a baker",
        "personality": "kind",
        "goals": ["bake"],
        "hobby": "knots",
    },
    "state": {"location": "quay", "mood": "calm", "inventory": ["loaf"], "coins": 3},
    "memory": {
        "capacity": 5,
        "cells": [{"tick": 1, "text": "I woke up."}, CELL],
        "summary": "busy",
        "archive": [{"tick": 0, "text": "Long ago.", "importance": 2, "note": None}],
        "unreflected": 7,
        "plan": {
            "date": "2026-11-29",
            "items": [{"at": "06:00", "intention": "bake", "why": "hungry"}],
            "mood": "eager",
        },
        "notes": {"z": 1, "a": [None, 2.5]},
    },
    "relationships": {
        "ada": {"kind": "friend", "trust": 0.75, "since": 2},
        "cy": {"kind": "rival", "trust": 1.0},
    },
    "inbox": [{"tick": 3, "from": "ada", "text": "Bread?", "mood": None}],
    "mystery": None,
}
LOCATION: dict[str, Any] = {
    "identity": {"id": "quay", "name": "Quay", "description": "wet", "smell": "salt"},
    "state": {"connections": ["hall"], "objects": ["rope"], "atmosphere": "busy"},
    "weather": {"rain": True},
}
META: dict[str, Any] = {"name": "Town", "description": "", "tick": 4, "seed": 7, "era": "1890"}


#: values put in place of each one: wrong types, out of range, not an id, an integral
#: float where an int is expected (lax validation would take it, strict must not)
WRONG: list[Any] = ["x", "Bad Id", "", 1.5, 3.0, -1, 0, 11, 10**6, True, None, [], {}, ["x"], [1]]


def dumped(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """The reference: pydantic's dump, on a copy."""
    out: dict[str, Any] = model.model_validate(copy.deepcopy(data)).model_dump(by_alias=True)
    return out


def text(data: Any) -> bytes:
    """Order- and type-sensitive: ``1`` and ``1.0`` differ, so do key orders."""
    return orjson.dumps(data)


def places(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every dict and list in ``data``, with the path to it."""
    if isinstance(data, dict | list):
        yield path, data
        items = data.items() if isinstance(data, dict) else enumerate(data)
        for key, value in items:
            yield from places(value, (*path, key))


def at(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


def variants(base: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``base`` and every input one edit away from it."""
    yield copy.deepcopy(base)
    edits: list[Callable[[Any], None]] = []
    for path, node in places(base):
        if isinstance(node, dict):
            keys = list(node)

            def reverse(d: dict[str, Any]) -> None:
                items = list(d.items())[::-1]
                d.clear()
                d.update(items)

            edits.append(lambda d, p=path: reverse(at(d, p)))
            for key in keys:
                edits.append(lambda d, p=path, k=key: at(d, p).pop(k))
                edits.append(lambda d, p=path, k=key: at(d, p).__setitem__(k, None))
                value = node[key]
                if isinstance(value, float) and value.is_integer():
                    edits.append(lambda d, p=path, k=key, v=value: at(d, p).__setitem__(k, int(v)))
                for wrong in WRONG:
                    edits.append(lambda d, p=path, k=key, w=wrong: at(d, p).__setitem__(k, w))

                def rename(d: dict[str, Any], key: str = key) -> None:
                    items = [("Bad Key" if k == key else k, v) for k, v in d.items()]
                    d.clear()
                    d.update(items)

                edits.append(lambda d, p=path, f=rename: f(at(d, p)))
                if key == "from":
                    edits.append(
                        lambda d, p=path: at(d, p).__setitem__("from_", at(d, p).pop("from"))
                    )
                    edits.append(lambda d, p=path: at(d, p).__setitem__("from_", "cy"))
            for i in range(len(keys) + 1):

                def insert(d: dict[str, Any], i: int = i) -> None:
                    items = list(d.items())
                    items.insert(i, ("zz_extra", [1, {"b": None}]))
                    d.clear()
                    d.update(items)

                edits.append(lambda d, p=path, f=insert: f(at(d, p)))
        else:
            edits.append(lambda d, p=path: at(d, p).clear())
            edits.append(lambda d, p=path: at(d, p).reverse())
            for i in range(len(node)):
                for wrong in WRONG:
                    edits.append(lambda d, p=path, i=i, w=wrong: at(d, p).__setitem__(i, w))
    for edit in edits:
        data = copy.deepcopy(base)
        edit(data)
        yield data


@pytest.mark.parametrize(
    ("model", "base"), [(Character, CHARACTER), (Location, LOCATION), (WorldMeta, META)]
)
def test_normal_form_equals_the_dump_for_every_variant(
    model: type[BaseModel], base: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid or not, kept or dumped: as pydantic says, for every variant one edit away from
    a file in normal form (the fast path's hardest cases)."""
    assert text(dumped(model, base)) == text(base)
    built = 0  # models rebuilt in order by the fast path, not dumped
    reordered = normal._reordered

    def counted(shape: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal built
        out = reordered(shape, data)
        built += out is not None
        return out

    monkeypatch.setattr(normal, "_reordered", counted)
    valid = kept = invalid = 0
    for data in variants(base):
        try:
            want = dumped(model, data)
        except ValidationError:
            with pytest.raises(ValidationError):
                normal_form(model, copy.deepcopy(data))
            invalid += 1
            continue
        valid += 1
        got = normal_form(model, data)
        kept += got is data
        assert text(got) == text(want), data
        # the normal form is recognised as such: loading what a commit wrote dumps nothing
        # (but a key of the world's own named like a field, ``from_``: the model decides)
        again = copy.deepcopy(want)
        assert normal_form(model, again) is again or b'"from_"' in text(want)
    assert valid > 10 and invalid > 10
    assert 0 < kept < valid  # both paths taken
    assert built > 0


def test_inputs_the_dump_changes_are_not_kept() -> None:
    """The cases named: defaults missing, ``null`` optionals, unknown keys before known
    ones, an alias written by field name, an integer trust."""
    normal = dumped(Character, CHARACTER)
    assert normal_form(Character, copy.deepcopy(normal)) == normal
    cases: list[Callable[[dict[str, Any]], None]] = [
        lambda d: d["identity"].pop("description"),
        lambda d: d["memory"].pop("summary"),
        lambda d: d.pop("memory"),
        lambda d: d["memory"].__setitem__("plan", None),
        lambda d: d["memory"]["cells"][1].__setitem__("importance", None),
        lambda d: d["memory"]["archive"][0].__setitem__("mentions", None),
        lambda d: d.__setitem__("inbox", None),
        lambda d: d["relationships"]["cy"].__setitem__("trust", 1),
        lambda d: d["inbox"][0].__setitem__("from_", d["inbox"][0].pop("from")),
        lambda d: d["state"].__setitem__("location", d["state"].pop("location")),
    ]
    for case in cases:
        data = copy.deepcopy(normal)
        case(data)
        want = dumped(Character, data)
        got = normal_form(Character, data)
        assert got is not data
        assert text(got) == text(want)
        assert text(got) != text(data)


def test_unknown_keys_after_known_ones_are_kept_as_they_are() -> None:
    normal = dumped(Character, CHARACTER)
    data = copy.deepcopy(normal)
    assert normal_form(Character, data) is data
    assert list(data)[-1] == "mystery" and data["mystery"] is None
    assert data["memory"]["archive"][0]["note"] is None


class _Lax(BaseModel):
    model_config = ConfigDict(extra="allow")
    n: int = 0


class _Stripped(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: Annotated[str, StringConstraints(strip_whitespace=True)]


class _Validated(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    n: int = 0

    @field_validator("n")
    @classmethod
    def _double(cls, value: int) -> int:
        return value * 2


class _Tuple(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    pair: tuple[int, int] = (0, 0)


class _Renamed(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    n: int = Field(0, validation_alias="m")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    n: int = Field(0, strict=False)


class _LooseItems(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    items: list[Annotated[int, Field(strict=False)]] = []


class _Nested(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    inner: list[_Stripped] = []


@pytest.mark.parametrize(
    "model", [_Lax, _Stripped, _Validated, _Tuple, _Renamed, _Loose, _LooseItems, _Nested]
)
def test_a_model_whose_values_may_change_is_refused(model: type[BaseModel]) -> None:
    """A model whose validation may convert a value (lax, a field or item lax, a
    transforming constraint, a validator, a type the check does not know, an input name
    of its own) has no fast path: a new field of that kind fails here (and on import),
    not in a world's bytes."""
    with pytest.raises(normal._Unvouched):
        normal._shape(model)


def appended(base: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], str, dict[str, Any]]]:
    """Every variant of ``base`` with one key of one of its dicts moved to the end of that
    dict, as a phase that sets a key it popped or did not have leaves it (the items of a
    list, cells and messages, which the engine builds whole, left out)."""
    for path, node in places(base):
        if not isinstance(node, dict) or any(isinstance(p, int) for p in path):
            continue
        for key in list(node)[:-1]:
            data = copy.deepcopy(base)
            where = at(data, path)
            where[key] = where.pop(key)
            yield path, key, data


@pytest.mark.parametrize(
    ("model", "base"), [(Character, CHARACTER), (Location, LOCATION), (WorldMeta, META)]
)
def test_normal_order_puts_an_appended_key_back_in_its_place(
    model: type[BaseModel], base: dict[str, Any]
) -> None:
    """``normal_order`` (what a commit writes) makes the model's dump of every dict a tick
    leaves with a key appended, in place, and leaves one in normal form as it is."""
    normal = dumped(model, base)
    assert normal_order(model, normal) is False
    assert text(normal) == text(dumped(model, base))
    moved = 0
    for path, key, data in appended(normal):
        want = dumped(model, data)
        before = text(data)
        inner = at(data, path)
        changed = normal_order(model, data)
        assert text(data) == text(want), (path, key)
        assert changed is (before != text(want)), (path, key)
        assert at(data, path) is inner  # the dict itself, its values moved
        moved += changed
    assert moved >= 3


def test_normal_order_fixes_an_integral_trust_and_a_tie_out_of_order() -> None:
    data = dumped(Character, CHARACTER)
    tie = data["relationships"]["cy"] = {"trust": 1, "kind": "rival", "since": 4}
    want = dumped(Character, data)
    assert normal_order(Character, data) is True
    assert text(data) == text(want)
    assert data["relationships"]["cy"] is tie
    assert list(tie) == ["kind", "trust", "since"] and type(tie["trust"]) is float


def test_normal_order_leaves_what_the_model_refuses_as_it_is() -> None:
    """Not validated: a value the model refuses is left for the next load to name (its
    dict still put in order where it can be), never a traceback."""
    for bad in ("x", 3, [1], ["x"], 2**60, -1.5):
        data = copy.deepcopy(CHARACTER)
        data["relationships"]["cy"]["trust"] = bad
        data["memory"]["plan"] = data["memory"].pop("plan")
        normal_order(Character, data)
        assert data["relationships"]["cy"]["trust"] == bad
        assert list(data["memory"])[:6] == list(CHARACTER["memory"])[:6]
        with pytest.raises(ValidationError):
            Character.model_validate(data)
    for bad in ("x", 3, [1]):  # a model's place holds something else
        data = copy.deepcopy(CHARACTER)
        data["memory"]["plan"] = bad
        data["relationships"] = {"cy": bad}
        data["inbox"] = data.pop("inbox")
        assert normal_order(Character, data) is True
        assert data["memory"]["plan"] == bad and data["relationships"] == {"cy": bad}

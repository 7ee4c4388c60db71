"""New worlds and editor schemas: ``sim init`` and ``sim schema``.

``init_world`` writes a small world that ``sim check`` and ``sim tick`` accept as it is: a
ring of locations, characters spread over them, a config on the offline provider, the
built-in prompt templates to edit, and a README. It is deterministic (the same arguments
give the same bytes) and writes everything into a scratch folder beside the target first,
so a failure leaves nothing behind.

``write_schemas`` writes JSON Schemas of ``world.json``, character and location files,
generated from the pydantic models that validate them (``sim.world``), so an editor
checks a file as it is typed against the same rules as ``sim check``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from sim.config import DEFAULT_ORDER
from sim.errors import InputError
from sim.network import NETWORK_TIE, Network
from sim.network import edges as network_edges
from sim.world import Character, Location, WorldMeta

MAX_ENTITIES = 500
#: the built-in prompt templates a new world gets copies of
PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_PEOPLE = (
    ("ada", "Ada Marsh", "A ferry pilot who knows every current of the river."),
    ("bram", "Bram Oakes", "The innkeeper, who hears everything and repeats half of it."),
    ("cora", "Cora Vell", "A young clerk newly arrived with a sealed letter."),
    ("dov", "Dov Hale", "A retired soldier who tends the town's only clock."),
    ("esme", "Esme Quill", "A mapmaker short of money and long on debts."),
    ("finn", "Finn Rusk", "A fisherman's son who wants to leave and never does."),
    ("greta", "Greta Lowe", "The baker, early to rise and quick to judge."),
    ("hal", "Hal Brenner", "A travelling tinker with a cart full of odd parts."),
)
_PLACES = (
    ("square", "Town Square", "Cobbles, a dry fountain and a notice board.", "fountain"),
    ("inn", "The Lantern Inn", "A low, warm room that smells of smoke and stew.", "hearth"),
    ("dock", "River Dock", "Tarred planks, rope coils and the ferry bell.", "ferry bell"),
    ("market", "Market Row", "Stalls under patched awnings, most of them shut.", "scales"),
    ("chapel", "Old Chapel", "Cold stone, a cracked window, a ledger of names.", "ledger"),
    ("mill", "Water Mill", "The wheel turns slowly; flour dust hangs in the air.", "millstone"),
)
_MOODS = ("curious", "wary", "hopeful", "restless")

WORLD_README = """\
# {name}

A world made by `sim init`: {characters} characters in {locations} locations, set up for the
offline provider (no key, no network). Try:

```
sim check --world {folder}
sim tick --world {folder} --ticks 3
sim log --world {folder} --tick all
```

- `world.json`: the world's name, description, tick and seed.
- `characters/<id>.json`, `locations/<id>.json`: one file per character and location; the
  file name is the id. Add fields to `state` freely: the engine keeps them, and `sim
  export` makes each a column.
{network}- `config.toml`: this world's settings (models, prices, budgets, phases); see
  `sim --help`. Where requests go and which key they carry (`provider`, `base_url`) are
  not a world's to choose: a shared world could send your key anywhere. Choose a real
  model on the command line or in your own config (`--config FILE` or `./config.toml`):
  `sim tick --world {folder} --provider openai` (`OPENAI_API_KEY` set), or for a
  local server `sim tick --world {folder} --provider chat --base-url URL --model NAME`.
- `prompts/`: the instructions each phase of this world sends, copied from sim's built-in
  ones; edit them to change how characters and the game master behave, or delete one to
  use the built-in again. A phase you turn on later (`reflection`, `planning`,
  `conversation`) uses the built-in until you add its file.

The format is described in sim's own documentation (`docs/world-format.md` and
`docs/providers.md` in sim's source, not in this folder); `sim schema --out schemas`
writes JSON Schemas an editor can check these files against as you type.
"""

NETWORK_README = """\
- `relationships` in each character file: who knows whom, written by
  `sim init --network {network}`; `sim export` gives them as the `edges` table.
"""

WORLD_CONFIG = """\
# This world's config: it overrides the built-in defaults (and ./config.toml); command-line
# flags override both. A real provider is chosen on the command line or in your own config,
# not here (see README.md): a world's config may not change where requests go.

[llm]
provider = "offline"        # no key, no network
"""


@dataclass(frozen=True)
class Created:
    """What ``init_world`` wrote."""

    root: Path
    characters: list[str]
    locations: list[str]
    files: list[str]
    #: relationships written (two per pair who know each other)
    relationships: int = 0


def _dump(data: Any) -> bytes:
    """JSON as the engine writes world files: 2-space indent, trailing newline."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"


def _name(table: tuple[tuple[str, ...], ...], i: int) -> tuple[str, ...]:
    """The i-th entry of a table, numbered after the first round (``ada``, ..., ``ada-2``)."""
    entry = table[i % len(table)]
    rounds = i // len(table)
    if rounds == 0:
        return entry
    return (f"{entry[0]}-{rounds + 1}", f"{entry[1]} {rounds + 1}", *entry[2:])


def ties(ids: list[str], network: Network | None, seed: int) -> dict[str, dict[str, Any]]:
    """Character id -> its relationships in ``network`` (both ways), each in id order."""
    out: dict[str, dict[str, Any]] = {cid: {} for cid in ids}
    if network is None:
        return out
    known: dict[int, list[int]] = {i: [] for i in range(len(ids))}
    for i, j in network_edges(network, len(ids), seed):
        known[i].append(j)
        known[j].append(i)
    for i, others in known.items():
        for j in sorted(others, key=lambda j: ids[j]):
            out[ids[i]][ids[j]] = dict(NETWORK_TIE)
    return out


def world_files(
    name: str,
    characters: int,
    locations: int,
    network: Network | None = None,
    seed: int = 1,
) -> dict[str, bytes]:
    """Every file of a new world (path relative to its folder -> bytes), prompts included.

    Args:
        network: relationships between the characters (none: no ``relationships``).
        seed: the world's seed, which also draws a random network.
    """
    places = [_name(_PLACES, i) for i in range(locations)]
    ids = [p[0] for p in places]
    files: dict[str, bytes] = {
        "world.json": _dump(
            {
                "name": name,
                "description": "A small river town on the evening the ferry fails to come.",
                "tick": 0,
                "seed": seed,
            }
        )
    }
    for i, (lid, title, description, thing) in enumerate(places):
        # a ring (a line for two, none for one): every place can be reached
        links = sorted({ids[(i - 1) % locations], ids[(i + 1) % locations]} - {lid})
        files[f"locations/{lid}.json"] = _dump(
            {
                "identity": {"id": lid, "name": title, "description": description},
                "state": {"connections": links, "objects": [thing], "atmosphere": "quiet"},
            }
        )
    people = [_name(_PEOPLE, i)[0] for i in range(characters)]
    network_ties = ties(people, network, seed)
    for i in range(characters):
        cid, full, description = _name(_PEOPLE, i)
        relationships = {"relationships": network_ties[cid]} if network_ties[cid] else {}
        files[f"characters/{cid}.json"] = _dump(
            {
                "identity": {
                    "id": cid,
                    "name": full,
                    "description": description,
                    "personality": "",
                    "goals": ["Find out why the ferry has not come"],
                },
                "state": {
                    "location": ids[i % locations],
                    "mood": _MOODS[i % len(_MOODS)],
                    "inventory": [],
                },
                "memory": {"capacity": 5, "cells": [], "summary": ""},
                **relationships,
            }
        )
    # the templates of the phases this world runs (the default list): a copy of one it
    # does not run would be an unused prompt, which `sim check` warns about
    for template in sorted(PROMPTS_DIR.glob("*.md")):
        if template.name.split(".", 1)[0] in DEFAULT_ORDER:
            files[f"prompts/{template.name}"] = template.read_bytes()
    files["config.toml"] = WORLD_CONFIG.encode()
    return files


def init_world(
    root: Path,
    characters: int = 3,
    locations: int = 2,
    network: Network | None = None,
    seed: int = 1,
) -> Created:
    """Write a new world into ``root`` (missing or an empty folder), its characters related
    by ``network`` if one is given (``sim.network``; a random one drawn with ``seed``).

    Raises:
        InputError: ``root`` is not empty or is a file, or a count is out of range.
    """
    for flag, count in (("--characters", characters), ("--locations", locations)):
        if not 1 <= count <= MAX_ENTITIES:
            raise InputError(None, flag, f"expected 1 to {MAX_ENTITIES} (got {count})")
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise InputError(root, None, "exists and is not a folder")
    if root.is_dir() and any(root.iterdir()):
        raise InputError(root, None, "is not empty: sim init writes only into a new folder")
    name = root.resolve().name.replace("-", " ").replace("_", " ").strip().title() or "New World"
    files = world_files(name, characters, locations, network, seed)
    readme = WORLD_README.format(
        name=name,
        characters=characters,
        locations=locations,
        folder=root.as_posix(),
        network=NETWORK_README.format(network=network) if network is not None else "",
    )
    files["README.md"] = readme.encode()
    root.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{root.name}.init-", dir=root.parent))
    try:
        for rel, data in files.items():
            path = scratch / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if root.is_dir():
            root.rmdir()  # empty, checked above; rename needs the name free
        os.replace(scratch, root)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    chars = sorted(rel.split("/")[1][:-5] for rel in files if rel.startswith("characters/"))
    places = sorted(rel.split("/")[1][:-5] for rel in files if rel.startswith("locations/"))
    related = sum(
        len(orjson.loads(data).get("relationships", {}))
        for rel, data in files.items()
        if rel.startswith("characters/")
    )
    return Created(root, chars, places, sorted(files), related)


# -- schemas -------------------------------------------------------------------------------------

#: file name -> (model, what it validates)
SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "world.schema.json": (WorldMeta, "world.json"),
    "character.schema.json": (Character, "characters/<id>.json"),
    "location.schema.json": (Location, "locations/<id>.json"),
}


def schema_of(model: type[BaseModel], title: str) -> dict[str, Any]:
    """A model's JSON Schema (draft 2020-12), titled by the file it validates."""
    schema = model.model_json_schema()
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        **schema,
        "title": title,
        "description": f"A sim world's {title} (docs/world-format.md). Unknown fields are "
        "allowed and kept by the engine.",
    }


def write_schemas(out: Path) -> list[Path]:
    """Write the world, character and location schemas into ``out`` (created if missing)."""
    if out.exists() and not out.is_dir():
        raise InputError(out, None, "exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, (model, title) in SCHEMAS.items():
        path = out / file_name
        path.write_bytes(_dump(schema_of(model, title)))
        written.append(path)
    from sim.study.design import StudyFile  # the study file of `sim study run`

    study = {
        "$schema": JSON_SCHEMA_DIALECT,
        **StudyFile.model_json_schema(by_alias=True),
        "title": "sim study file",
        "description": "A study for `sim study run` (TOML; docs/analysis.md). Unknown "
        "fields are refused.",
    }
    path = out / "study.schema.json"
    path.write_bytes(_dump(study))
    written.append(path)
    return written


__all__ = [
    "MAX_ENTITIES",
    "SCHEMAS",
    "Created",
    "init_world",
    "schema_of",
    "world_files",
    "write_schemas",
]

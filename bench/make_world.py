"""Make a reproducible synthetic world of N characters and M locations from a seed.

    python bench/make_world.py OUT_DIR --characters 10000 [--locations 1000] [--seed 1]

Locations form a connected graph (a ring plus random chords, some one-way); characters have
descriptions of a few hundred characters, goals, inventory and 5 memory cells, as a real
world would. The same arguments always write the same bytes.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

import orjson

FIRST = (
    "Ada",
    "Bram",
    "Corin",
    "Dara",
    "Edda",
    "Fenn",
    "Gale",
    "Hale",
    "Isa",
    "Jory",
    "Kell",
    "Lune",
    "Mara",
    "Nell",
    "Orin",
    "Pell",
    "Quin",
    "Rhea",
    "Sten",
    "Tova",
    "Ulla",
    "Vale",
    "Wren",
    "Yara",
    "Zeph",
)
LAST = (
    "Ashdown",
    "Brine",
    "Corley",
    "Dunmore",
    "Ebb",
    "Fairweather",
    "Gorse",
    "Hollis",
    "Ivers",
    "Kerrow",
    "Lark",
    "Marr",
    "Nettle",
    "Penhallow",
    "Quill",
    "Rook",
    "Strand",
    "Thorne",
    "Voss",
    "Wyck",
)
TRADES = (
    "glassblower",
    "net-mender",
    "ferryman",
    "herbalist",
    "smith",
    "scribe",
    "cooper",
    "lamplighter",
    "baker",
    "tide-warden",
    "fiddler",
    "chandler",
    "weaver",
    "potter",
)
TRAITS = (
    "patient",
    "quick-tempered",
    "curious",
    "secretive",
    "generous",
    "proud",
    "anxious",
    "cheerful",
    "stubborn",
    "sly",
    "gentle",
    "ambitious",
    "dreamy",
    "blunt",
)
PLACES = (
    "Market",
    "Quay",
    "Chapel",
    "Mill",
    "Forge",
    "Orchard",
    "Well",
    "Gate",
    "Tower",
    "Inn",
    "Bridge",
    "Square",
    "Garden",
    "Yard",
    "Wharf",
    "Hall",
)
ADJ = (
    "Old",
    "North",
    "Salt",
    "Lantern",
    "Green",
    "Hollow",
    "Iron",
    "Low",
    "High",
    "Misty",
    "Copper",
    "Willow",
    "Stone",
    "Amber",
)
OBJECTS = (
    "lantern",
    "ledger",
    "brass key",
    "coil of rope",
    "map",
    "fishing net",
    "bell",
    "crate",
    "letter",
    "knife",
    "jar of honey",
    "loom",
    "anvil",
    "compass",
    "candle",
)
MOODS = ("calm", "restless", "hopeful", "wary", "tired", "cheerful", "irritable", "thoughtful")


def _sentence(rng: random.Random, words: int) -> str:
    pool = TRAITS + TRADES + MOODS + OBJECTS
    text = " ".join(rng.choice(pool) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def make_world(out: Path, characters: int, locations: int, seed: int = 1) -> None:
    """Write the world folder ``out`` (replacing it)."""
    rng = random.Random(seed)
    if out.exists():
        shutil.rmtree(out)
    (out / "characters").mkdir(parents=True)
    (out / "locations").mkdir()
    dump = orjson.OPT_INDENT_2
    loc_ids = [f"loc-{i:05d}" for i in range(locations)]
    for i, lid in enumerate(loc_ids):
        connections = {loc_ids[(i + 1) % locations], loc_ids[(i - 1) % locations]}
        for _ in range(rng.randint(0, 2)):
            connections.add(rng.choice(loc_ids))
        connections.discard(lid)
        name = f"{rng.choice(ADJ)} {rng.choice(PLACES)} {i}"
        data = {
            "identity": {"id": lid, "name": name, "description": f"{name}. " + _sentence(rng, 40)},
            "state": {
                "connections": sorted(connections),
                "objects": rng.sample(OBJECTS, 3),
                "atmosphere": _sentence(rng, 8),
            },
        }
        (out / "locations" / f"{lid}.json").write_bytes(orjson.dumps(data, option=dump) + b"\n")
    for i in range(characters):
        cid = f"char-{i:05d}"
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        trade = rng.choice(TRADES)
        goals = [
            f"find the {rng.choice(OBJECTS)} at {rng.choice(PLACES)}",
            f"make peace with a rival {rng.choice(TRADES)}",
        ]
        data = {
            "identity": {
                "id": cid,
                "name": name,
                "description": f"{name}, a {trade}. " + _sentence(rng, 45),
                "personality": ", ".join(rng.sample(TRAITS, 3)) + ". " + _sentence(rng, 10),
                "goals": goals,
            },
            "state": {
                "location": rng.choice(loc_ids),
                "mood": rng.choice(MOODS),
                "inventory": rng.sample(OBJECTS, 2),
            },
            "memory": {
                "capacity": 5,
                "cells": [{"tick": 0, "text": _sentence(rng, 18)} for _ in range(5)],
                "summary": _sentence(rng, 30),
            },
        }
        (out / "characters" / f"{cid}.json").write_bytes(orjson.dumps(data, option=dump) + b"\n")
    meta = {
        "name": f"Synthetic {characters}",
        "description": "A generated benchmark world.",
        "tick": 0,
        "seed": seed,
    }
    (out / "world.json").write_bytes(orjson.dumps(meta, option=dump) + b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--characters", type=int, default=1000)
    parser.add_argument("--locations", type=int, default=None, help="default: characters / 10")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    locations = args.locations or max(1, args.characters // 10)
    make_world(args.out, args.characters, locations, args.seed)


if __name__ == "__main__":
    main()

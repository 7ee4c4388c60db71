"""A condition's network (``sim.study.network``): the ties replace the relationships, a
pair the world already relates keeps its relationship, and a shape is drawn with the
seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import InputError
from sim.network import Network
from sim.study.network import ConditionNetwork, Tie, apply_network, read_edges
from sim.world import World


def world(relationships: dict[str, dict[str, dict[str, object]]]) -> World:
    chars = {
        cid: {
            "identity": {"id": cid, "name": cid.title()},
            "state": {"location": "a"},
            **({"relationships": relationships[cid]} if cid in relationships else {}),
        }
        for cid in ("ada", "bram", "cora", "dov")
    }
    return World(Path("w"), {"name": "w", "tick": 0, "seed": 0}, chars, {})


def test_edges_replace_the_relationships_keeping_a_known_pair() -> None:
    w = world(
        {
            "ada": {"bram": {"kind": "sister", "trust": 0.9, "since": 3}, "cora": {"kind": "x"}},
            "dov": {"ada": {"kind": "rival"}},
        }
    )
    ties = (Tie("ada", "bram"), Tie("dov", "cora", kind="friend", trust=0.7))
    apply_network(w, ConditionNetwork(ties=ties), seed=1)
    rel = {cid: c.get("relationships") for cid, c in w.characters.items()}
    assert rel["ada"] == {"bram": {"kind": "sister", "trust": 0.9, "since": 3}}  # kept
    assert rel["bram"] == {"ada": {"kind": "acquaintance", "trust": 0.5}}  # new: both ways
    assert rel["cora"] == {"dov": {"kind": "friend", "trust": 0.7}}  # the file's kind, trust
    assert rel["dov"] == {"cora": {"kind": "friend", "trust": 0.7}}  # the rival tie is gone


def test_a_shape_is_drawn_with_the_seed() -> None:
    dense = ConditionNetwork(shape=Network("random", 0.5))
    ids = ["ada", "bram", "cora", "dov", "esme", "finn", "greta", "hal"]
    assert dense.pairs(ids, 3) == dense.pairs(ids, 3)
    assert any(dense.pairs(ids, s) != dense.pairs(ids, 3) for s in range(4, 10))
    ring = ConditionNetwork(shape=Network("ring")).pairs(ids, 0)
    assert len(ring) == 8 and ("ada", "bram") in ring and ("ada", "hal") in ring


def test_an_edge_file_through_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real.csv").write_text("from,to\nada,bram\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.csv")
    study = tmp_path / "study.toml"
    with pytest.raises(InputError) as err:
        read_edges(study, "conditions.x.edges", "link.csv", {"ada", "bram"})
    assert err.value.field == "conditions.x.edges"
    assert read_edges(study, "conditions.x.edges", "real.csv", {"ada", "bram"}).ties

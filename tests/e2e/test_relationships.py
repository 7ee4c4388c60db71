"""Typed relationships between characters (issue 27): checked references, declared in the
editor schema, shown to the model, updated by a declared phase. Through the CLI."""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from sim import sections
from sim.cli import main
from sim.ticklog.format import log_path, unpack_state
from sim.ticklog.reader import read_log


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _edit(path: Path, **top: Any) -> None:
    data = orjson.loads(path.read_bytes())
    data.update(top)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


def new_world(tmp_path: Path, *args: str) -> Path:
    world = tmp_path / "w"
    result = invoke("init", str(world), *args)
    assert result.exit_code == 0, result.output
    return world


def test_check_names_each_broken_relationship_by_file_and_field(tmp_path: Path) -> None:
    world = new_world(tmp_path)  # ada, bram, cora
    chars = world / "characters"
    _edit(chars / "ada.json", relationships={"bram": {"kind": "friend"}, "zed": {"kind": "x"}})
    _edit(chars / "bram.json", relationships={"bram": {"kind": "self"}})
    _edit(chars / "cora.json", relationships={"ada": {"kind": "", "trust": 2}})
    before = {p.name: p.read_bytes() for p in chars.iterdir()}
    result = invoke("check", "--world", str(world))
    assert result.exit_code != 0
    out = result.output
    assert "ada.json" in out and "relationships.zed" in out and "unknown character 'zed'" in out
    assert "bram.json" in out and "relationships.bram" in out and "itself" in out
    assert "cora.json" in out and "relationships.ada.kind" in out
    assert "relationships.ada.trust" in out
    assert "relationships.bram:" not in out.split("ada.json", 1)[1].split("\n", 1)[0]
    assert invoke("tick", "--world", str(world)).exit_code != 0  # nothing runs
    assert {p.name: p.read_bytes() for p in chars.iterdir()} == before


def test_a_deleted_character_leaves_a_broken_reference(tmp_path: Path) -> None:
    world = new_world(tmp_path)
    _edit(world / "characters" / "ada.json", relationships={"cora": {"kind": "sister"}})
    assert invoke("check", "--world", str(world)).exit_code == 0
    (world / "characters" / "cora.json").unlink()
    result = invoke("check", "--world", str(world))
    assert result.exit_code != 0
    assert "relationships.cora" in result.output and "unknown character 'cora'" in result.output


def test_the_editor_schema_declares_relationships(tmp_path: Path) -> None:
    assert invoke("schema", "--out", str(tmp_path / "s")).exit_code == 0
    schema = orjson.loads((tmp_path / "s" / "character.schema.json").read_bytes())
    ties = next(s for s in schema["properties"]["relationships"]["anyOf"] if s["type"] == "object")
    assert list(ties["patternProperties"].values()) == [{"$ref": "#/$defs/Relationship"}]
    rel = schema["$defs"]["Relationship"]
    assert rel["required"] == ["kind"]
    assert rel["properties"]["trust"]["minimum"] == 0
    assert rel["properties"]["trust"]["maximum"] == 1


def test_relationships_reach_the_intentions_input_and_files_keep_them(tmp_path: Path) -> None:
    world = new_world(tmp_path)
    tie = {"kind": "rival", "trust": 0.2, "since": "the flood"}
    _edit(world / "characters" / "ada.json", relationships={"bram": tie})
    bram_before = (world / "characters" / "bram.json").read_bytes()
    result = invoke("tick", "--world", str(world))
    assert result.exit_code == 0, result.output
    log = read_log(log_path(world, 1))
    inputs = {c.entity_key: sections.loads(c.input) for c in log.calls.values()}
    ada = inputs["intention:ada"]
    assert ada["relationships"] == [{"id": "bram", "name": "Bram Oakes", **tie}]
    assert "relationships" not in inputs["intention:bram"]  # nothing added where none
    saved = orjson.loads((world / "characters" / "ada.json").read_bytes())
    assert saved["relationships"] == {"bram": tie}
    # a file without relationships gets no empty field on save
    assert b"relationships" not in (world / "characters" / "bram.json").read_bytes()
    assert b"relationships" not in bram_before


BOND_CONFIG = """
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "bond", "memory"]

[phases.bond]
per = "character"
instructions = "prompts/bond.md"
schema = "schemas/bond.json"
writes = { "relationships" = "updates", "state.mood" = "mood" }
"""


def bond_schema(ids: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "mood": {"type": "string", "maxLength": 40},
            "updates": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "to": {"type": "string", "enum": ids},
                        "kind": {"type": "string", "enum": ["friend", "rival"]},
                        "trust": {"type": "number", "minimum": 0, "maximum": 1},
                    },
                    "required": ["to", "trust"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["mood", "updates"],
        "additionalProperties": False,
    }


def bond_world(tmp_path: Path) -> Path:
    world = new_world(tmp_path, "--characters", "4")
    (world / "config.toml").write_text('[llm]\nprovider = "offline"\n' + BOND_CONFIG)
    (world / "schemas").mkdir()
    ids = sorted(p.stem for p in (world / "characters").glob("*.json"))
    (world / "schemas" / "bond.json").write_bytes(orjson.dumps(bond_schema(ids)))
    (world / "prompts" / "bond.md").write_text("How do you feel about the others now?\n")
    for cid in ids:  # everyone starts as an acquaintance of the next
        other = ids[(ids.index(cid) + 1) % len(ids)]
        _edit(world / "characters" / f"{cid}.json", relationships={other: {"kind": "friend"}})
    return world


def test_a_declared_phase_updates_relationships(tmp_path: Path) -> None:
    world = bond_world(tmp_path)
    check = invoke("check", "--world", str(world))
    assert check.exit_code == 0, check.output
    ids = sorted(p.stem for p in (world / "characters").glob("*.json"))
    expected = {
        cid: orjson.loads((world / "characters" / f"{cid}.json").read_bytes())["relationships"]
        for cid in ids
    }
    for ties in expected.values():
        for tie in ties.values():
            tie.setdefault("trust", 0.5)
    result = invoke("tick", "--world", str(world), "--ticks", "3")
    assert result.exit_code == 0, result.output
    first = read_log(log_path(world, 1))
    shown = {c.entity_key: sections.loads(c.input) for c in first.calls.values()}
    for cid in ids:  # the phase's default input shows the subject's relationships
        ties = [t["id"] for t in shown[f"bond:{cid}"]["relationships"]]
        assert ties == list(expected[cid])
    refused = merged = 0
    for tick in (1, 2, 3):  # what the answers say, merged as documented
        answers = read_log(log_path(world, tick)).phase_results("bond")
        assert set(answers) == set(ids)
        for cid in ids:
            ties = copy.deepcopy(expected[cid])
            for update in answers[cid]["updates"]:
                fields = {k: v for k, v in update.items() if k != "to" and v is not None}
                ties[update["to"]] = {**ties.get(update["to"], {}), **fields}
            # naming itself, or a new relationship without a kind: the whole write is undone
            if cid in ties or not all("kind" in tie for tie in ties.values()):
                refused += 1
                continue
            merged += ties != expected[cid]
            expected[cid] = ties
    assert merged and refused  # both paths taken with this seed
    for cid in ids:
        saved = orjson.loads((world / "characters" / f"{cid}.json").read_bytes())
        assert saved["relationships"] == expected[cid]
    assert invoke("check", "--world", str(world)).exit_code == 0


def test_a_relationships_write_must_take_a_list_of_updates(tmp_path: Path) -> None:
    world = bond_world(tmp_path)
    config = (
        (world / "config.toml")
        .read_text()
        .replace('"relationships" = "updates"', '"relationships" = "mood"')
    )
    (world / "config.toml").write_text(config)
    result = invoke("check", "--world", str(world))
    assert result.exit_code != 0
    assert "phases.bond.writes.relationships" in result.output
    assert "array of objects" in result.output


# -- export: the edges table, baseline rows, identity columns -----------------------------------


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def edges_of(world: Path, files: dict[str, bytes] | None = None) -> list[tuple[str, str, dict]]:
    """(from, to, tie) of every relationship in the world folder (or a state snapshot)."""
    out = []
    if files is None:
        files = {
            f"characters/{p.name}": p.read_bytes() for p in (world / "characters").glob("*.json")
        }
    for rel in sorted(files):
        if rel.startswith("characters/"):
            data = orjson.loads(files[rel])
            for other, tie in sorted((data.get("relationships") or {}).items()):
                out.append((data["identity"]["id"], other, tie))
    return out


def test_export_has_edges_baseline_rows_and_identity_columns(tmp_path: Path) -> None:
    world = bond_world(tmp_path)
    for n, path in enumerate(sorted((world / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["identity"].update(age=30 + n, occupation={"trade": "miller", "years": n})
        data["relationships"][next(iter(data["relationships"]))]["since"] = f"year {n}"
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    start = edges_of(world)
    assert invoke("tick", "--world", str(world), "--ticks", "3").exit_code == 0
    out = tmp_path / "tables"
    result = invoke("export", "--world", str(world), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "edges" in result.output

    columns, rows = read_csv(out / "edges.csv")
    assert columns == ["tick", "from", "to", "kind", "trust", "since"]
    by_tick: dict[int, list[tuple[str, str, dict]]] = {}
    for row in rows:
        tie = {k: row[k] for k in ("kind", "trust", "since") if row[k] != ""}
        by_tick.setdefault(int(row["tick"]), []).append((row["from"], row["to"], tie))
    assert sorted(by_tick) == [0, 1, 2, 3]

    def text(edges: list[tuple[str, str, dict]]) -> list[tuple[str, str, dict]]:
        return [(a, b, {k: str(v) for k, v in t.items()}) for a, b, t in edges]

    assert by_tick[0] == text([(a, b, {"trust": 0.5, **t}) for a, b, t in start])
    assert by_tick[3] == text(edges_of(world))  # the world folder after the last tick
    after_1 = unpack_state(read_log(log_path(world, 2)).state_before)  # type: ignore[arg-type]
    assert by_tick[1] == text(edges_of(world, after_1))
    assert by_tick[0] != by_tick[3]  # the bond phase changed the network

    columns, chars = read_csv(out / "characters.csv")
    assert {"identity.name", "identity.age", "identity.occupation.trade"} <= set(columns)
    assert "identity.id" not in columns
    assert [r["tick"] for r in chars[:4]] == ["0"] * 4
    assert chars[0]["identity.age"] == "30" and chars[1]["identity.occupation.years"] == "1"

    jsonl = tmp_path / "jsonl"
    assert (
        invoke("export", "--world", str(world), "--out", str(jsonl), "--format", "jsonl").exit_code
        == 0
    )
    records = [orjson.loads(line) for line in (jsonl / "edges.jsonl").read_bytes().splitlines()]
    assert len(records) == len(rows) and isinstance(records[0]["trust"], float)
    # a window leaves the baseline out unless it starts before the first tick
    windowed = tmp_path / "windowed"
    assert (
        invoke("export", "--world", str(world), "--out", str(windowed), "--from", "2").exit_code
        == 0
    )
    _, rows = read_csv(windowed / "edges.csv")
    assert sorted({r["tick"] for r in rows}) == ["2", "3"]


def test_load_gives_an_edges_frame_ready_for_a_graph(tmp_path: Path) -> None:
    pytest.importorskip("pandas", reason="the analysis extra (pandas) is not installed")
    from sim.analysis import load

    world = bond_world(tmp_path)
    assert invoke("tick", "--world", str(world), "--ticks", "2").exit_code == 0
    frames = load(world)
    edges = frames.edges
    assert list(edges.columns) == ["tick", "from", "to", "kind", "trust"]
    assert sorted(set(edges["tick"])) == [0, 1, 2]
    last = edges[edges.tick == 2]
    graph = {(a, b): t for a, b, t in zip(last["from"], last["to"], last["trust"], strict=True)}
    assert graph == {(a, b): t["trust"] for a, b, t in edges_of(world)}
    baseline = frames.characters[frames.characters.tick == 0]
    assert len(baseline) == 4 and baseline["action"].isna().all()
    assert baseline["identity.name"].iloc[0] == "Ada Marsh"


# -- sim init --network -------------------------------------------------------------------------


def network_of(world: Path) -> dict[str, set[str]]:
    out = {}
    for path in sorted((world / "characters").glob("*.json")):
        data = orjson.loads(path.read_bytes())
        ties = data.get("relationships", {})
        assert all(t == {"kind": "acquaintance", "trust": 0.5} for t in ties.values())
        out[path.stem] = set(ties)
    for cid, others in out.items():  # both ways
        assert all(cid in out[o] for o in others) and cid not in others
    return out


def init_network(tmp_path: Path, name: str, network: str, n: int, seed: int = 1) -> Path:
    world = tmp_path / name
    args = ["--characters", str(n), "--network", network, "--seed", str(seed)]
    result = invoke("init", str(world), *args)
    assert result.exit_code == 0, result.output
    assert f"network {network}" in result.output
    check = invoke("check", "--world", str(world))
    assert check.exit_code == 0, check.output
    assert orjson.loads((world / "world.json").read_bytes())["seed"] == seed
    return world


def test_init_writes_a_ring_and_a_star(tmp_path: Path) -> None:
    ring = network_of(init_network(tmp_path, "ring", "ring", 8))
    order = ["ada", "bram", "cora", "dov", "esme", "finn", "greta", "hal"]  # as created
    assert sorted(ring) == order
    for i, cid in enumerate(order):
        assert ring[cid] == {order[i - 1], order[(i + 1) % 8]}
    star = network_of(init_network(tmp_path, "star", "star", 6))
    assert star["ada"] == {"bram", "cora", "dov", "esme", "finn"}
    assert all(star[c] == {"ada"} for c in star if c != "ada")


def test_init_small_world_keeps_k_and_rewires(tmp_path: Path) -> None:
    n = 20
    rewired = 0
    for seed in (1, 2, 3):
        net = network_of(init_network(tmp_path, f"sw{seed}", "small-world", n, seed))
        pairs = {tuple(sorted((a, b))) for a, others in net.items() for b in others}
        assert len(pairs) == n * 4 // 2  # k = 4: rewiring moves edges, never adds them
        assert len(net) == n
        lattice = network_of(init_network(tmp_path, f"ring{seed}", "ring", n, seed))
        # the lattice's nearest neighbours are mostly still there (p = 0.1)
        kept = sum(len(lattice[c] & net[c]) for c in net)
        assert kept >= 0.6 * 2 * n
        rewired += sum(len(net[c]) != 4 for c in net) > 0 or kept < 2 * n
    assert rewired  # some edge moved with one of the seeds


def test_init_random_networks_follow_p_and_the_seed(tmp_path: Path) -> None:
    empty = network_of(init_network(tmp_path, "p0", "random:0", 10))
    assert all(not others for others in empty.values())
    full = network_of(init_network(tmp_path, "p1", "random:1", 10))
    assert all(len(others) == 9 for others in full.values())
    n, p = 40, 0.3
    a = init_network(tmp_path, "a", f"random:{p}", n, seed=5)
    b = init_network(tmp_path, "b", f"random:{p}", n, seed=5)
    c = init_network(tmp_path, "c", f"random:{p}", n, seed=6)
    files = lambda w: {q.name: q.read_bytes() for q in (w / "characters").iterdir()}  # noqa: E731
    assert files(a) == files(b)  # deterministic with the seed
    assert network_of(a) != network_of(c)
    pairs = sum(len(o) for o in network_of(a).values()) // 2
    expected = p * n * (n - 1) / 2  # 234, standard deviation ~12.8
    assert abs(pairs - expected) < 4 * 12.8


def test_init_refuses_an_unknown_network(tmp_path: Path) -> None:
    for bad in ("mesh", "random:1.5", "random:x", "random", "ring:2"):
        result = invoke("init", str(tmp_path / "w"), "--network", bad)
        assert result.exit_code == 2, (bad, result.output)
        assert "--network" in result.output and "random:p" in result.output
        assert not (tmp_path / "w").exists()


def test_a_network_world_ticks_and_exports_its_edges(tmp_path: Path) -> None:
    world = init_network(tmp_path, "w", "ring", 5)
    assert invoke("tick", "--world", str(world), "--ticks", "2").exit_code == 0
    out = tmp_path / "t"
    assert invoke("export", "--world", str(world), "--out", str(out)).exit_code == 0
    _, rows = read_csv(out / "edges.csv")
    assert len(rows) == 3 * 10  # ticks 0, 1, 2 x 5 pairs both ways
    assert {(r["from"], r["to"]) for r in rows if r["tick"] == "0"} == {
        (a, b) for a, others in network_of(world).items() for b in others
    }


def test_init_json_names_the_network(tmp_path: Path) -> None:
    result = invoke("init", str(tmp_path / "w"), "--characters", "5", "--network", "star", "--json")
    assert result.exit_code == 0, result.output
    made = orjson.loads(result.output)
    assert made["network"] == "star" and made["relationships"] == 8


def test_sim_set_refuses_a_broken_relationship_and_writes_nothing(tmp_path: Path) -> None:
    world = init_network(tmp_path, "w", "ring", 3)
    before = (world / "characters" / "ada.json").read_bytes()
    for bad, words in (
        ('ada.relationships.zed={"kind": "x"}', "unknown character 'zed'"),
        ('ada.relationships.ada={"kind": "x"}', "itself"),
        ("ada.relationships.bram.trust=3", "less than or equal to 1"),
    ):
        result = CliRunner().invoke(main, ["set", "--world", str(world), bad])
        assert result.exit_code == 2, result.output
        assert "characters/ada.json" in result.output and words in result.output
    assert (world / "characters" / "ada.json").read_bytes() == before
    ok = invoke("set", "--world", str(world), "ada.relationships.bram.trust=0.9")
    assert ok.exit_code == 0, ok.output
    assert invoke("check", "--world", str(world)).exit_code == 0


def test_an_attribute_named_like_a_key_column_keeps_its_value(tmp_path: Path) -> None:
    world = new_world(tmp_path)
    tie = {"kind": "debtor", "to": "the bank", "name": "Old Bram", "id": "x"}
    _edit(world / "characters" / "ada.json", relationships={"bram": tie})
    assert invoke("tick", "--world", str(world)).exit_code == 0
    out = tmp_path / "t"
    assert invoke("export", "--world", str(world), "--out", str(out)).exit_code == 0
    columns, rows = read_csv(out / "edges.csv")
    assert columns[:5] == ["tick", "from", "to", "kind", "trust"]
    assert {(r["to"], r["attribute.to"], r["name"]) for r in rows} == {
        ("bram", "the bank", "Old Bram")
    }
    shown = sections.loads(read_log(log_path(world, 1)).calls["1:intentions:intention:ada:0"].input)
    assert shown["relationships"][0]["id"] == "bram"
    assert shown["relationships"][0]["name"] == "Bram Oakes"  # the character's, not the tie's


def test_a_fixed_write_into_an_unknown_relationship_is_undone(tmp_path: Path) -> None:
    world = bond_world(tmp_path)
    (world / "schemas" / "bond.json").write_bytes(
        orjson.dumps(
            {
                "type": "object",
                "properties": {"kind": {"type": "string", "enum": ["rival"]}},
                "required": ["kind"],
                "additionalProperties": False,
            }
        )
    )
    config = (world / "config.toml").read_text()
    config = config.replace(
        '"relationships" = "updates", "state.mood" = "mood"', '"relationships.zed.kind" = "kind"'
    )
    (world / "config.toml").write_text(config)
    before = {p.name: p.read_bytes() for p in (world / "characters").iterdir()}
    result = invoke("tick", "--world", str(world))
    assert result.exit_code == 0, result.output
    assert "unknown character 'zed'" in result.output  # reported as ignored
    for path in (world / "characters").iterdir():
        ties = orjson.loads(path.read_bytes())["relationships"]
        held = orjson.loads(before[path.name])["relationships"]
        assert ties == {k: {**v, "trust": 0.5} for k, v in held.items()}  # default filled
    assert invoke("check", "--world", str(world)).exit_code == 0


def test_a_studys_tables_have_every_runs_edges(tmp_path: Path, monkeypatch: Any) -> None:
    """`sim export --study` and `sim.analysis.load_study` carry the edges table, led by
    condition, seed and run like the others."""
    monkeypatch.chdir(tmp_path)
    init_network(tmp_path, "w", "star", 3)
    (tmp_path / "study.toml").write_text(
        'world = "w"\nseeds = "1"\nticks = 2\n[conditions.control]\n[conditions.shock]\n'
        'set = [{ tick = 2, path = "ada.relationships.bram.trust", value = 0.1 }]\n'
    )
    result = invoke("study", "run", "study.toml", "--out", "runs")
    assert result.exit_code == 0, result.output
    out = tmp_path / "tables"
    result = invoke("export", "--study", "runs", "--out", str(out))
    assert result.exit_code == 0, result.output
    columns, rows = read_csv(out / "edges.csv")
    assert columns[:3] == ["condition", "seed", "run"]
    assert {"tick", "from", "to", "kind", "trust"} <= set(columns)
    trust = {
        (r["condition"], r["tick"]): r["trust"]
        for r in rows
        if r["from"] == "ada" and r["to"] == "bram"
    }
    assert trust[("control", "2")] == "0.5" and trust[("shock", "2")] == "0.1"
    assert trust[("control", "0")] == trust[("shock", "0")] == "0.5"
    pytest.importorskip("pandas", reason="the analysis extra (pandas) is not installed")
    from sim.analysis import load_study

    frames = load_study(tmp_path / "runs")
    assert len(frames.edges) == len(rows)


def test_sim_ask_shows_the_character_its_relationships(tmp_path: Path, stub_server: Any) -> None:
    """An interview's input, as the server received it, lists who the character knows."""
    world = init_network(tmp_path, "w", "star", 3)
    args = ("--provider", "chat", "--base-url", stub_server.base_url)
    result = invoke("ask", "--world", str(world), "ada", "Whom do you trust?", *args)
    assert result.exit_code == 0, result.output
    result = invoke("ask", "--world", str(world), "bram", "Whom do you trust?", *args)
    assert result.exit_code == 0, result.output
    [ada, bram] = [r for r in stub_server.log if "messages" in r]
    said = {
        name: orjson.loads(next(m["content"] for m in r["messages"] if m["role"] == "user"))
        for name, r in (("ada", ada), ("bram", bram))
    }
    assert [t["id"] for t in said["ada"]["you"]["relationships"]] == ["bram", "cora"]
    assert said["bram"]["you"]["relationships"] == [
        {"id": "ada", "name": "Ada Marsh", "kind": "acquaintance", "trust": 0.5}
    ]


def ref_bond_world(tmp_path: Path) -> tuple[Path, list[str]]:
    """``bond_world`` whose updates name the other character by ``x-sim-ref`` (no enum),
    under the default ``constrain_refs``."""
    world = bond_world(tmp_path)
    ids = sorted(p.stem for p in (world / "characters").glob("*.json"))
    schema = bond_schema(ids)
    schema["properties"]["updates"]["items"]["properties"]["to"] = {
        "type": "string",
        "x-sim-ref": "character",
    }
    schema["properties"]["updates"]["items"]["required"] = ["to", "kind", "trust"]
    (world / "schemas" / "bond.json").write_bytes(orjson.dumps(schema))
    return world, ids


def test_x_sim_ref_fields_work_offline_and_check_samples_respect_them(tmp_path: Path) -> None:
    """Issue 39: offline, a declared phase's x-sim-ref fields came back as made-up words
    (every answer refused, the tick not committed), and `sim check` warned that a sample
    answer (which ignored the reference) would be refused."""
    world, ids = ref_bond_world(tmp_path)
    check = invoke("check", "--world", str(world))
    assert check.exit_code == 0, check.output
    assert "sample answer" not in check.output, check.output
    result = invoke("tick", "--world", str(world), "--ticks", "2")
    assert result.exit_code == 0, result.output
    for tick in (1, 2):
        log = read_log(log_path(world, tick))
        assert not [c for c in log.calls.values() if c.phase == "bond" and c.failed]
        answers = log.phase_results("bond")
        assert set(answers) == set(ids)
        assert all(u["to"] in ids for a in answers.values() for u in a["updates"])


def test_a_whole_relationships_object_can_be_set(tmp_path: Path) -> None:
    """Issue 39: refused in a world whose phase writes relationships (the value was held to
    the phase's answer type: a list of updates)."""
    world, ids = ref_bond_world(tmp_path)
    ties = {ids[1]: {"kind": "rival", "trust": 0.1}, ids[2]: {"kind": "friend"}}
    result = invoke(
        "set", "--world", str(world), f"{ids[0]}.relationships={orjson.dumps(ties).decode()}"
    )
    assert result.exit_code == 0, result.output
    saved = orjson.loads((world / "characters" / f"{ids[0]}.json").read_bytes())
    # written in normal form, as a load gives it: the tie's default trust filled in
    assert saved["relationships"] == {
        ids[1]: {"kind": "rival", "trust": 0.1},
        ids[2]: {"kind": "friend", "trust": 0.5},
    }
    # still checked as a world file: a tie to nobody is refused
    result = invoke(
        "set", "--world", str(world), f'{ids[0]}.relationships={{"nobody": {{"kind": "x"}}}}'
    )
    assert result.exit_code == 2 and "relationships" in result.output, result.output

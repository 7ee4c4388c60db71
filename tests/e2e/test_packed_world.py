"""A packed world through the commands: ``sim pack``, then ``sim tick`` on 1, 2 and 3 workers,
``sim log``, ``sim replay``, ``sim rewind``, ``sim fork``, ``sim sweep`` and ``sim serve``
see the world its folders would be, and ``sim unpack`` gives back the folders' files, byte
for byte. Real processes for the workers, a real server on 127.0.0.1, real files."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from click.testing import CliRunner
from conftest import DEMO, tree

from sim.cli import main
from sim.pack import PACK
from sim.serve import preview
from tests.e2e.serve_client import served
from tests.e2e.test_workers import invoke, story, without_walls

TOKEN = "t0ken-for-pack-tests"


def _world(dest: Path, packed: bool) -> Path:
    shutil.copytree(DEMO, dest, ignore=shutil.ignore_patterns(".sim"))
    if packed:
        assert "packed: 19 entity files into world.pack" in invoke("pack", "--world", str(dest))
    return dest


def _states(world: Path) -> dict[str, bytes]:
    """The world's files but its logs (which hold timings) and its form."""
    return {rel: data for rel, data in tree(world).items() if not rel.startswith(".sim/log/")}


def test_a_packed_world_ticks_on_1_2_and_3_workers_to_its_folders_files_and_story(
    tmp_path: Path,
) -> None:
    folders = _world(tmp_path / "folders", packed=False)
    invoke("tick", "--world", str(folders), "--ticks", "3")
    told = story(folders, 3)
    for workers in (1, 2, 3):
        world = _world(tmp_path / f"packed{workers}", packed=True)
        shown = invoke("tick", "--world", str(world), "--ticks", "3", "--workers", str(workers))
        assert "one process" not in shown
        assert sorted(os.listdir(world)) == [".sim", "world.json", PACK]
        assert story(world, 3) == told
        replayed = invoke("replay", "--world", str(world), "--tick", "2")
        assert "identical" in replayed
        invoke("unpack", "--world", str(world))
        assert _states(world) == _states(folders)


def test_rewind_fork_and_a_sweep_keep_a_packed_worlds_form_and_state(tmp_path: Path) -> None:
    folders = _world(tmp_path / "folders", packed=False)
    world = _world(tmp_path / "packed", packed=True)
    for each in (folders, world):
        invoke("tick", "--world", str(each), "--ticks", "3")
        invoke("rewind", "--world", str(each), "--tick", "3")
        invoke(
            "fork",
            "--world",
            str(each),
            "--tick",
            "2",
            "--to",
            str(each.parent / f"{each.name}-fork"),
        )
    fork = tmp_path / "packed-fork"
    assert sorted(os.listdir(fork)) == [".sim", "world.json", PACK]
    invoke("unpack", "--world", str(fork))
    invoke("unpack", "--world", str(world))
    assert _states(world) == _states(folders)
    assert _states(fork) == _states(tmp_path / "folders-fork")
    invoke("pack", "--world", str(world))
    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        main,
        ["sweep", "--world", str(world), "--seeds", "1-2", "--ticks", "1", "--out", str(runs)],
    )
    assert result.exit_code == 0, result.output
    made = sorted(p for p in runs.iterdir() if p.is_dir())
    assert len(made) == 2
    for run in made:
        assert (run / PACK).is_file() and not (run / "characters").exists()
        assert "tick 3" in without_walls(invoke("log", "--world", str(run), "--tick", "3"))


def test_the_page_loads_a_packed_world_and_its_first_look_reads_the_pack(
    tmp_path: Path,
) -> None:
    folders = _world(tmp_path / "folders", packed=False)
    world = _world(tmp_path / "packed", packed=True)
    look, folder_look = preview.scan(world, 1 << 20), preview.scan(folders, 1 << 20)
    assert (look.files, look.skipped) == (folder_look.files, 0)
    assert look.world.characters == folder_look.world.characters

    async def check() -> None:
        client = await served(world, TOKEN, preview_from=0)
        try:
            for _ in range(500):
                answer = await client.get(
                    "/api/world", headers={"Authorization": f"Bearer {TOKEN}"}
                )
                if answer.status != 503:
                    break
                await asyncio.sleep(0.02)
            assert answer.status == 200, await answer.text()
            body = await answer.json()
            assert body["total_characters"] == len(look.world.characters)
        finally:
            await client.close()

    asyncio.run(check())

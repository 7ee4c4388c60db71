"""``sim serve``: watch and steer a world from a browser page (``sim.serve``)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
from pathlib import Path

import click

from sim.cli.common import (
    CONFIG,
    WORLD,
    build_config,
    echo,
    errors,
    port_option,
    shard_count,
    workers_options,
)
from sim.errors import UserError


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one)."""
    try:
        ip = ipaddress.ip_address(host)
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@click.command("serve")
@WORLD
@CONFIG
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on; another than loopback is reachable from the network "
    "(a warning says so; the token is still needed).",
)
@port_option(0, "The port (0: a free one).")
@click.option("--read-only", is_flag=True, help="Show the world; refuse every change.")
@click.option("--open", "open_page", is_flag=True, help="Open the page in a browser.")
@workers_options
def serve(
    world_dir: Path,
    config_file: Path | None,
    host: str,
    port: int,
    read_only: bool,
    open_page: bool,
    workers: str,
    executor: str,
    ray_address: str | None,
) -> None:
    """Serve a page that shows WORLD live and runs, pauses and steers it (docs/serve.md).

    WORLD may also be a study's or a sweep's folder (``--out``): the page then lists its
    runs and how far each has gone, as they go.

    The first line printed is the page's address with its token; every request needs
    the token (the page keeps it as a session cookie). The world is loaded and validated
    after that, while the page says "loading"; a world that does not validate is shown
    as its problems (here and on the page) and the command then exits 2 when stopped.
    Ctrl-C stops the server after the tick running, if any, has committed.

    With ``--workers N`` the page's runs shard each tick as ``sim tick --workers N``
    does, with the same result; a run's workers are started once and serve all its ticks.
    """
    import asyncio  # here, not with the module: `sim --help` loads every command's module
    import secrets
    import signal

    from aiohttp import web

    from sim.serve.app import Settings, make_app
    from sim.serve.loading import Status
    from sim.serve.runs import folder_kind, runs_view
    from sim.storage import Storage

    with errors():
        shards = shard_count(workers, executor, ray_address)
        config = build_config(config_file, world_dir)
        kind = folder_kind(world_dir)
        if kind is None:
            # a missing folder or a bad world.json exits 2 here; the entities, which take
            # seconds for a big world, are loaded and validated once serving (on_loaded)
            Storage(world_dir, config.limits.max_entity_bytes).load_meta()
        else:
            runs_view(world_dir)  # a study whose record cannot be read: exit 2 now
            if shards > 1 or ray_address is not None:
                raise UserError(
                    f"--workers: {world_dir} is a {kind}'s folder, whose runs the page lists "
                    "and does not run; give a world folder to run it on workers"
                )
        try:
            sock = _bind(host, port)
        except OSError as exc:
            raise click.UsageError(
                f"--host/--port: cannot listen on {host}:{port}: {exc}"
            ) from None
        token = secrets.token_urlsafe(24)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        url = f"http://{shown}:{bound_port}/?token={token}"
        echo(url)
        if not _loopback(host):
            echo(
                f"warning: listening on {host}, reachable from other machines; anyone "
                "who can see the token can run and change this world",
                err=True,
            )
        last: list[Status] = []

        def on_loaded(status: Status) -> None:
            """The load's end, on stderr: the counts, or each problem (exit 2 at the end)."""
            last[:] = [status]
            if status.state == "ready":
                echo(
                    f"loaded {status.characters:,} characters and {status.locations:,} "
                    f"locations ({status.seconds:.1f} s)",
                    err=True,
                )
            else:
                echo(f"error: {status.error}", err=True)
                echo(
                    "the page shows these problems; fix the files (the world is loaded "
                    "again when they change), or Ctrl-C to stop",
                    err=True,
                )

        app = make_app(
            Settings(
                world_dir,
                config,
                token,
                read_only=read_only,
                runs=kind,
                on_loaded=on_loaded,
                workers=shards,
                executor=executor,
                ray_address=ray_address,
            )
        )

        async def main() -> None:
            runner = web.AppRunner(app, handle_signals=False, access_log=None)
            await runner.setup()
            await web.SockSite(runner, sock).start()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for number in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(number, stop.set)
            if open_page:
                import webbrowser

                webbrowser.open(url)
            what = f"the {kind} in {world_dir}" if kind else f"{world_dir} (loading it)"
            echo(f"serving {what}{' (read-only)' if read_only else ''}; Ctrl-C stops", err=True)
            try:
                await stop.wait()
            finally:
                echo("stopping (a tick running commits first)", err=True)
                await runner.cleanup()

        asyncio.run(main())
        if last and last[0].state == "invalid":
            sys.exit(2)  # the world served could not be loaded (its problems were shown)

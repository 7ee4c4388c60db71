"""``sim stub-server``: a loopback OpenAI-compatible server answered by the offline model."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import click

#: the stub server's ``RANDOM_FAULTS``, restated so that `sim --help` does not import the
#: server (a test pins the two together)
DEFAULT_FAULTS = ("rate_limit", "server_error", "hang", "malformed", "refusal", "incomplete")


@click.command("stub-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=8765,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port (0: any free port).",
)
@click.option(
    "--latency",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds before each answer.",
)
@click.option(
    "--latency-jitter",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Extra uniform random latency, up to this many seconds.",
)
@click.option(
    "--fault-rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Probability of a random fault per generation request.",
)
@click.option(
    "--faults",
    default=",".join(DEFAULT_FAULTS),
    show_default=True,
    help="Comma-separated faults the fault rate draws from.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Randomness seed.")
@click.option(
    "--reject-json-schema",
    is_flag=True,
    help="Reject response_format json_schema as llama-cpp-python does (HTTP 500); "
    'take {"type": "json_object", "schema": ...} instead.',
)
@click.option(
    "--slots",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Requests generated at once, the rest queued (1: a single-slot local server; "
    "0: no limit).",
)
@click.option(
    "--stream-chunk-delay",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds between the events of a streamed answer.",
)
def stub_server(
    host: str,
    port: int,
    latency: float,
    latency_jitter: float,
    fault_rate: float,
    faults: str,
    seed: int,
    reject_json_schema: bool,
    slots: int,
    stream_chunk_delay: float,
) -> None:
    """Serve a loopback OpenAI-compatible API answered by the offline model.

    Rehearse a large run for free: point --base-url at it with --provider openai or chat.
    GET /stub/stats reports requests and tokens served.
    """
    from sim.testing.stub_server import FAULTS, StubOptions, StubServer

    kinds = tuple(f.strip() for f in faults.split(",") if f.strip())
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        click.echo(
            f"error: unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}",
            err=True,
        )
        sys.exit(2)
    options = StubOptions(
        latency=latency,
        latency_jitter=latency_jitter,
        fault_rate=fault_rate,
        faults=kinds,
        seed=seed,
        reject_json_schema=reject_json_schema,
        slots=slots,
        stream_chunk_delay=stream_chunk_delay,
    )
    server = StubServer(options)

    async def serve() -> None:
        await server.start(host, port)
        click.echo(f"stub server on http://{host}:{server.port}/v1 (Ctrl-C to stop)", err=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())

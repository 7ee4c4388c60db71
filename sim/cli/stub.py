"""``sim stub-server``: a loopback OpenAI-compatible (or Gemini API, or Anthropic Messages
API) server answered by the offline model."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import click

from sim.cli.common import count_option, echo, port_option, seconds_option

#: the stub server's ``RANDOM_FAULTS``, restated so that `sim --help` does not import the
#: server (a test pins the two together)
DEFAULT_FAULTS = ("rate_limit", "server_error", "hang", "malformed", "refusal", "incomplete")


@click.command("stub-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@port_option(8765, "Port (0: any free port).")
@seconds_option(
    "--latency",
    default=0.0,
    help="Seconds before each answer.",
)
@seconds_option(
    "--latency-jitter",
    default=0.0,
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
@count_option(
    "--slots",
    minimum=0,
    default=0,
    help="Requests generated at once, the rest queued (1: a single-slot local server; "
    "0: no limit).",
)
@click.option(
    "--capacity-report",
    default="",
    type=click.Choice(["", "props", "slots", "llama-cpp-python"]),
    help="How the server reports its capacity (--slots, or 1): llama.cpp's GET /props and "
    "/slots, only /slots, or llama-cpp-python's /openapi.json (one request at a time); "
    "empty: not at all.",
)
@seconds_option(
    "--stream-chunk-delay",
    default=0.0,
    help="Seconds between the events of a streamed answer.",
)
@seconds_option(
    "--batch-delay",
    default=0.0,
    help="Seconds a Batch API batch (POST /v1/batches) stays in progress.",
)
@click.option(
    "--api",
    default="openai",
    show_default=True,
    type=click.Choice(["openai", "gemini", "anthropic"]),
    help="Wire format: OpenAI's (/v1/responses, /v1/chat/completions), the Gemini API's "
    "(/v1beta/models/{model}:generateContent) or Anthropic's Messages API (/v1/messages; "
    "adds the overloaded, permission and bad_request faults).",
)
def stub_server(host: str, port: int, faults: str, api: str, **tuning: Any) -> None:
    """Serve a loopback OpenAI-compatible API answered by the offline model.

    Rehearse a large run for free: point --base-url at it with --provider openai or chat
    (or, with --api gemini, --provider gemini; with --api anthropic, --provider anthropic).
    GET /stub/stats reports requests and tokens served.
    """
    from sim.testing.anthropic_stub import ANTHROPIC_FAULTS, AnthropicStubServer
    from sim.testing.gemini_stub import GEMINI_FAULTS, GeminiStubServer
    from sim.testing.stub_server import FAULTS, StubOptions, StubServer

    kinds = tuple(f.strip() for f in faults.split(",") if f.strip())
    known = {"gemini": GEMINI_FAULTS, "anthropic": ANTHROPIC_FAULTS}.get(api, FAULTS)
    unknown = sorted(set(kinds) - set(known))
    if unknown:
        echo(
            f"error: unknown fault(s) {', '.join(unknown)}; choose from {', '.join(known)}",
            err=True,
        )
        sys.exit(2)
    options = StubOptions(faults=kinds, **tuning)  # the other options: its fields, by name
    server: StubServer
    if api == "gemini":
        server = GeminiStubServer(options)
    elif api == "anthropic":
        server = AnthropicStubServer(options)
    else:
        server = StubServer(options)
    root = f"http://{host}:{{port}}" + ("" if api in ("gemini", "anthropic") else "/v1")
    import asyncio  # here, not with the module: `sim --help` loads every command's module

    async def serve() -> None:
        await server.start(host, port)
        url = root.format(port=server.port)
        echo(f"stub server on {url} ({api} API; Ctrl-C to stop)", err=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())

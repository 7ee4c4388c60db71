"""HTTP benchmark scenarios: latency-bound efficiency (scenario 2) and client CPU per call
(scenario 3), through ``--provider openai`` against the stub server on 127.0.0.1.

The stub server always runs in a separate process, so its CPU is not counted against the
client (on a 2-core machine it has the other core). For ``https`` it serves a self-signed
certificate made for the run (``bench.tls``), which the clients trust through
``SSL_CERT_FILE`` (httpx's public setting, read by the SDK's default client, its aiohttp
client and the engine alike). Each command prints one JSON object::

    python -m bench.http efficiency CHARACTERS LATENCY CONCURRENCY [STRUCTURED_OUTPUT]
    python -m bench.http cpu CHARACTERS LATENCY CONCURRENCY [REPEATS [SCHEME]]
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import openai

import sim.providers._openai_family as family
from bench.make_world import make_world
from bench.tls import SelfSigned, self_signed
from sim.config import load_config
from sim.engine.runner import Runner, TickResult
from sim.llm.client import LLMRequest
from sim.llm.events import LLMEvent
from sim.phases.base import PhaseReport
from sim.providers._openai_common import ClientOptions, Connections, read_key, strict_schema
from sim.providers.http import pool_sizes, shared_ssl_context

#: the environment variable holding the (dummy) key the stub server accepts
KEY_ENV = "SIM_BENCH_STUB_KEY"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Stub:
    """A running stub server process."""

    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU the server process has used so far (Linux ``/proc``)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def stub_server(latency: float, tls: SelfSigned | None = None) -> Iterator[Stub]:
    """The stub server with a fixed latency in a child process (``https`` with ``tls``)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    certificate = [str(tls.cert), str(tls.key)] if tls else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.stub", f"{latency}", *certificate],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"(https?://\S+/v1)", line)
        if match is None:
            raise RuntimeError(f"stub server did not start: {line!r}")
        yield Stub(match.group(1), proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stub_stats(base_url: str, tls: SelfSigned | None = None) -> dict[str, Any]:
    root = base_url.rsplit("/v1", 1)[0]
    context = tls.client_context() if tls else None
    with urllib.request.urlopen(f"{root}/stub/stats", timeout=10, context=context) as resp:
        stats: dict[str, Any] = json.loads(resp.read())
    return stats


@dataclass
class EngineRun:
    """One tick through the openai provider, timed per phase (wall and client CPU)."""

    result: TickResult
    wall: float
    phase_wall: dict[str, float]
    phase_cpu: dict[str, float]
    requests: list[tuple[str, LLMRequest]]  # (model, request) of every call, in order
    latencies: list[float]  # seconds from each call's start to its answer, as the client saw

    @property
    def calls(self) -> int:
        return self.result.calls

    @property
    def phases_cpu(self) -> float:
        return sum(self.phase_cpu.values())


def sdk_connections(*, max_concurrency: int = 16, **options: Any) -> Connections:
    """The bench's comparison row: the engine's adapters with every request on the SDK's
    own stack (one ``AsyncOpenAI`` per pool of connections, as if handed in), in place of
    ``build_connections``' aiohttp routes. sim sends through the SDK only for a client a
    user hands in; this builds such clients the way the engine would size its pools."""
    import httpx2

    count, size = pool_sizes(max_concurrency)
    settings: ClientOptions = options  # type: ignore[assignment]
    key = read_key(settings["api_key_env"], require_key=settings.get("require_key", True))

    def client() -> openai.AsyncOpenAI:
        http_client = openai.DefaultAsyncHttpxClient(
            limits=httpx2.Limits(max_connections=size, max_keepalive_connections=size),
            verify=shared_ssl_context(),
        )
        return openai.AsyncOpenAI(
            api_key=key,
            base_url=settings["base_url"] or None,
            max_retries=0,
            timeout=httpx2.Timeout(
                settings["timeout_seconds"], connect=settings["connect_timeout_seconds"]
            ),
            default_headers=settings.get("default_headers"),
            default_query=settings.get("default_query"),
            http_client=http_client,
        )

    return Connections([None] * count, clients={i: client() for i in range(count)})


def engine_tick(
    tmp: Path,
    characters: int,
    base_url: str,
    concurrency: int,
    *,
    record: bool = False,
    sdk_path: bool = False,
    sdk_client: str = "default",
    structured_output: str = "auto",
) -> EngineRun:
    """Make a fresh synthetic world in ``tmp`` and run one tick of it against ``base_url``
    (``structured_output``: ``[llm] structured_output``, the default ``auto`` or a form).

    ``sdk_path``: send through the SDK's ``client.post`` on httpx's default (anyio)
    transport instead of the engine's own aiohttp routes (``http.Route``: the bench's
    ``sdk_connections`` in place of ``build_connections``); with ``sdk_client="aiohttp"``
    on the SDK's aiohttp client instead (an experiment: ``sdk_connections`` builds its
    clients with ``openai.DefaultAsyncHttpxClient``, swapped here).
    """
    sdk_stack = (
        mock.patch.object(family, "build_connections", sdk_connections)
        if sdk_path
        else contextlib.nullcontext()
    )
    sdk_http_client = (
        mock.patch.object(openai, "DefaultAsyncHttpxClient", openai.DefaultAioHttpClient)
        if sdk_client == "aiohttp"
        else contextlib.nullcontext()
    )
    world = tmp / "world"
    make_world(world, characters, max(1, characters // 10), seed=1)
    os.sync()  # the commit's flushes should not pay for writing out the generated world
    os.environ.setdefault(KEY_ENV, "sk-stub")
    config = load_config(
        cwd=tmp,
        overrides={
            "llm": {
                "provider": "openai",
                "base_url": base_url,
                "api_key_env": KEY_ENV,
                "max_concurrency": concurrency,
                "structured_output": structured_output,
            }
        },
    )
    phase_wall: dict[str, float] = {}
    phase_cpu: dict[str, float] = {}
    marks: dict[str, tuple[float, float]] = {}

    def on_phase(name: str, stage: str, _report: PhaseReport | None) -> None:
        now = (time.perf_counter(), time.process_time())
        if stage == "start":
            marks[name] = now
        else:
            phase_wall[name] = now[0] - marks[name][0]
            phase_cpu[name] = now[1] - marks[name][1]

    requests: list[tuple[str, LLMRequest]] = []
    latencies: list[float] = []

    def sink(event: LLMEvent) -> None:
        if record and event.kind == "llm_called":
            requests.append((event.model, event.request))
        elif event.kind == "llm_completed":
            latencies.append(event.latency)

    started = time.perf_counter()
    with sdk_stack, sdk_http_client:
        result = Runner(world, config, events=sink, on_phase=on_phase).run(1)[0]
    wall = time.perf_counter() - started
    if result.failures:
        raise RuntimeError(f"{result.failures} calls failed: {result.reports}")
    return EngineRun(result, wall, phase_wall, phase_cpu, requests, latencies)


def efficiency(
    characters: int, latency: float, concurrency: int, structured_output: str = "auto"
) -> dict[str, Any]:
    """Scenario 2: one tick; ideal = Σ over phases ceil(calls / concurrency) × latency."""
    with stub_server(latency) as stub, tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        server_started = stub.cpu_seconds()  # its start-up is not the tick's
        run = engine_tick(
            Path(tmp), characters, stub.url, concurrency, structured_output=structured_output
        )
        server_cpu = stub.cpu_seconds() - server_started
        served = stub_stats(stub.url)["requests"]
    phases = []
    ideal = 0.0
    for report in run.result.reports:
        phase_ideal = math.ceil(report.calls / concurrency) * latency
        ideal += phase_ideal
        phases.append(
            {
                "phase": report.name,
                "calls": report.calls,
                "ideal_s": phase_ideal,
                "wall_s": run.phase_wall[report.name],
                "cpu_s": run.phase_cpu[report.name],
            }
        )
    phases_wall = sum(run.phase_wall.values())
    return {
        "characters": characters,
        "latency_s": latency,
        "concurrency": concurrency,
        "structured_output": structured_output,
        "calls": run.calls,
        "served": served,
        "ideal_s": ideal,
        "tick_wall_s": run.wall,
        "phases_wall_s": phases_wall,
        "load_s": run.result.timings["load"],
        "commit_s": run.result.timings["commit"],
        "client_cpu_s": run.phases_cpu,
        "server_cpu_s": server_cpu,
        "call_latency_median_s": statistics.median(run.latencies),
        "call_latency_p90_s": sorted(run.latencies)[int(0.9 * len(run.latencies))],
        "efficiency": ideal / run.wall,
        "phases_efficiency": ideal / phases_wall,
        "phases": phases,
    }


#: the SDK's HTTP clients a bare loop can use
CLIENTS = ("default", "aiohttp")


async def bare_loop(
    base_url: str, requests: list[tuple[str, LLMRequest]], concurrency: int, kind: str
) -> tuple[float, float]:
    """The same calls through a bare ``AsyncOpenAI(max_retries=0).responses.create`` loop,
    ``concurrency`` workers; returns (wall, CPU) seconds of the loop.

    ``kind``: ``"default"``, the SDK's default client (httpx, keeps 100 connections
    alive); ``"aiohttp"``, ``openai.DefaultAioHttpClient()`` (the ``openai[aiohttp]``
    extra; ``RuntimeError`` when it is not installed).
    """
    http_client = openai.DefaultAioHttpClient() if kind == "aiohttp" else None
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key="sk-stub", max_retries=0, http_client=http_client
    )
    queue = list(reversed(requests))

    async def worker() -> None:
        while queue:
            model, request = queue.pop()
            response = await client.responses.create(
                model=model,
                instructions=request.instructions,
                input=request.input_data,
                text={
                    "format": {
                        "type": "json_schema",
                        "name": request.schema.__name__,
                        "schema": strict_schema(request.schema),
                        "strict": True,
                    }
                },
                store=False,
            )
            if not response.output_text:
                raise RuntimeError("empty answer")

    try:
        wall, cpu = time.perf_counter(), time.process_time()
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(requests))):
                group.create_task(worker())
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await client.close()


def aiohttp_installed() -> bool:
    """Whether the ``openai[aiohttp]`` extra is installed (its client would raise if not)."""
    return importlib.util.find_spec("aiohttp") is not None


def restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def cpu_per_call(
    characters: int,
    latency: float,
    concurrency: int,
    repeats: int = 3,
    schemes: tuple[str, ...] = ("http", "https"),
) -> dict[str, dict[str, Any]]:
    """Scenario 3: client CPU per call over each of ``schemes``, the engine (whole tick's
    phases; on its aiohttp routes, and on the SDK's stacks for comparison) vs bare SDK
    loops sending the same requests (default client; aiohttp client when installed).

    One stub server per scheme, all started first; each of the ``repeats`` rounds runs
    every client over every scheme in turn, so the schemes' figures come from the same
    minutes of a machine whose speed drifts (their ratio is a target too)."""
    kinds = [k for k in CLIENTS if k != "aiohttp" or aiohttp_installed()]
    names = ["engine", "engine_sdk"]
    if "aiohttp" in kinds:
        names.append("engine_sdk_aiohttp")
    names += [f"bare_{kind}" for kind in kinds]
    runs: dict[str, dict[str, list[float]]] = {s: {n: [] for n in names} for s in schemes}
    calls = 0
    with contextlib.ExitStack() as stack:
        urls = {}
        for scheme in schemes:
            tls = None
            if scheme == "https":
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="sim-bench-tls-"))
                tls = self_signed(Path(folder))
                stack.callback(restore_env, "SSL_CERT_FILE", os.environ.get("SSL_CERT_FILE"))
                os.environ["SSL_CERT_FILE"] = str(tls.cert)  # every client trusts it, publicly
            urls[scheme] = stack.enter_context(stub_server(latency, tls)).url
        for _ in range(repeats):
            for scheme, url in urls.items():
                got = runs[scheme]
                with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
                    run = engine_tick(Path(tmp), characters, url, concurrency, record=True)
                calls = run.calls
                got["engine"].append(run.phases_cpu / run.calls * 1e6)
                with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
                    sdk = engine_tick(Path(tmp), characters, url, concurrency, sdk_path=True)
                got["engine_sdk"].append(sdk.phases_cpu / sdk.calls * 1e6)
                if "aiohttp" in kinds:
                    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
                        sdk = engine_tick(
                            Path(tmp),
                            characters,
                            url,
                            concurrency,
                            sdk_path=True,
                            sdk_client="aiohttp",
                        )
                    got["engine_sdk_aiohttp"].append(sdk.phases_cpu / sdk.calls * 1e6)
                for kind in kinds:
                    _, cpu = asyncio.run(bare_loop(url, run.requests, concurrency, kind))
                    got[f"bare_{kind}"].append(cpu / len(run.requests) * 1e6)
    out = {}
    for scheme, got in runs.items():
        medians = {name: statistics.median(values) for name, values in got.items()}
        bare = medians["bare_default"]
        out[scheme] = {
            "scheme": scheme,
            "characters": characters,
            "latency_s": latency,
            "concurrency": concurrency,
            "calls": calls,
            "repeats": repeats,
            "aiohttp": "aiohttp" in kinds,
            "us_per_call": medians,
            "runs_us": got,
            "ratio": {name: value / bare for name, value in medians.items()},
        }
    return out


def main() -> None:
    kind = sys.argv[1]
    characters, latency, concurrency = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    if kind == "efficiency":
        form = sys.argv[5] if len(sys.argv) > 5 else "auto"
        out = efficiency(characters, latency, concurrency, form)
    else:
        repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 3
        schemes = tuple(sys.argv[6].split(",")) if len(sys.argv) > 6 else ("http", "https")
        out = cpu_per_call(characters, latency, concurrency, repeats, schemes)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

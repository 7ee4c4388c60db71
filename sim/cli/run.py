"""``sim tick`` and ``sim check``: run a world, or validate it.

What ``sim tick`` shows while it runs (progress, ETA, ``--stream``) is ``sim.cli.progress``;
here are the commands, the policy prompt and the committed tick's report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from sim.cli.common import (
    CONFIG,
    EVERY_PHASE_MODEL,
    PROVIDER,
    SETTINGS,
    WORLD,
    build_config,
    count_option,
    echo,
    echo_lines,
    secho,
    shard_count,
    styled,
    workers_options,
)
from sim.cli.jsonout import (
    JSON_LINES_HELP,
    JSON_OPTION,
    check_document,
    emit,
    json_errors,
    tick_document,
)
from sim.terminal import one_line, printable, wrapped

if TYPE_CHECKING:  # the engine is imported by the commands that run it (`sim --help` is fast)
    from sim.config import Config
    from sim.engine.probe import ProbeResult
    from sim.engine.runner import TickResult
    from sim.errors import InputError
    from sim.llm.events import LLMEvent
    from sim.llm.pool import ServerReport
    from sim.policy import Approval


def servers_line(servers: list[ServerReport]) -> str:
    """A pool's tick: per server (``host:port``), calls answered, attempts moved away, and
    whether it is out of the pool."""
    from sim.analysis.logview import server_name

    parts = []
    for server in servers:
        text = f"{server_name(server.url)} {server.answered} answered"
        if server.moved_away:
            text += f", {server.moved_away} moved away"
        if server.state != "closed":
            text += ", out of the pool (probed again after the cool-down)"
        parts.append(text)
    return "servers: " + " · ".join(parts)


class _PromptInterrupted(Exception):
    """Ctrl-C at a policy's y/N prompt."""


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Let Ctrl-C end a blocking read of the terminal. asyncio's SIGINT handler only
    cancels the run's main task, which a blocked ``input()`` never notices: this handler
    calls it (so the run stops as on any Ctrl-C: exit 130, the tick resumable) and then
    breaks the read with ``_PromptInterrupted``."""

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # asyncio's: cancel the run, count the interrupt
            raise _PromptInterrupted
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class TerminalApprover:
    """Answers what a policy asks (``approve_above_usd``, a custom policy's ``ask``): a y/N
    prompt on a terminal; with ``--yes`` approved without asking; with no terminal refused.

    Args:
        yes: approve every ask (``sim tick --yes``).
        interactive: whether a person can answer (default: stdin is a terminal).
    """

    def __init__(self, yes: bool, interactive: bool | None = None) -> None:
        self.yes = yes
        self.interactive = sys.stdin.isatty() if interactive is None else interactive

    def __call__(self, question: str) -> Approval:
        from sim.policy import Approval

        if self.yes:
            echo(f"\napproved (--yes): {question}", err=True)
            return Approval(True, "--yes")
        if not self.interactive:
            return Approval(
                False,
                "no terminal",
                "no terminal to ask: run `sim tick` on a terminal to answer, or pass --yes",
            )
        try:
            # Ctrl-C at the prompt interrupts the run (exit 130); the handler is in place
            # before the prompt shows, so a Ctrl-C typed at once is not lost
            with _interruptible():
                echo(f"\n{question} [y/N]: ", nl=False, err=True)
                answer = input()
        except EOFError:  # Ctrl-D: no
            answer = ""
        except _PromptInterrupted:
            return Approval(False, "terminal", "interrupted at the prompt")
        approved = answer.strip().lower() in ("y", "yes")
        return Approval(approved, "terminal", "" if approved else "answered no at the prompt")


def moved_lines(result: TickResult, width: int = 88) -> list[str]:
    """``moved: Name (From → To), ...``: who moved this tick, by name, wrapped at ``width``
    between moves (a move is never split). The names are world text: shown escaped, their
    line breaks too (``one_line``), so the width is what the terminal gets."""
    lines: list[str] = []
    line = "moved:"
    for i, (name, a, b) in enumerate(result.moves_by_name()):
        move = one_line(f"{name} ({a} → {b})")
        if i and len(line) + 2 + len(move) > width:
            lines.append(line + ",")
            line = " " * len("moved: ") + move
        else:
            line = f"{line}{',' if i else ''} {move}"
    lines.append(line)
    return lines


def print_tick(result: TickResult, streamed: set[str] | frozenset[str] = frozenset()) -> None:
    """A committed tick on stdout: notes, each place's narrative (but those in
    ``streamed``, shown as they were written), moves, fallbacks and the calls table."""
    secho(f"\n== tick {result.tick} ==", bold=True)
    for note in result.notes:
        echo(f"note: {one_line(note)}")
    if result.resumed_calls:
        echo(
            f"resumed: {result.resumed_calls} calls taken from the interrupted tick's "
            "log, not sent again"
        )
    if streamed:
        echo(f"narratives: {len(streamed)} places, shown above as they were written")
    places: list[str] = []
    for lid, text in result.narratives.items():
        if lid in streamed:
            continue
        places.append(styled(f"\n[{one_line(result.location_names.get(lid, lid))}]", fg="cyan"))
        places.append(printable(wrapped(text)))
    echo_lines(places)
    if result.moved:
        echo()
        for line in moved_lines(result):
            echo(line)
    for report in result.reports:
        for entity_key, reason in report.errors.items():
            # an error may take several lines (a server's text among them): each one after
            # the first is indented, so none can pass for a line of sim's own
            lines = str(reason).splitlines() or [""]
            shown = "\n".join([lines[0], *(f"    {line}" for line in lines[1:])])
            echo(f"fallback: {one_line(report.name)} {one_line(entity_key)}: {shown}")
        for entity_key, models in report.model_fallbacks.items():
            echo(one_line(f"fallback model: {report.name} {entity_key}: {models}"))
        for warning in report.warnings:  # one line each, which may quote a name
            echo(one_line(f"ignored: {warning}"))
        for gap in report.gaps:
            echo(one_line(f"no outcome: {gap}"))
    pushed = result.backpressure
    if pushed and (pushed["rate_limited"] or pushed["timeouts"] or pushed["down_failures"]):
        echo(
            f"\nbackpressure: {pushed['rate_limited']} rate-limited and {pushed['timeouts']} "
            f"timed-out attempts (retried), paused {pushed['paused_seconds']:.1f}s; "
            f"concurrency limit {pushed['limit']} (lowest {pushed['lowest_limit']})"
        )
    if result.servers:
        echo("\n" + servers_line(result.servers))
    echo("\nphase        calls  failed  retries  input tok  output tok")
    for report in result.reports:
        if report.name == "apply":
            continue
        echo(
            f"{report.name:<12} {report.calls:>5}  {report.failures:>6}  {report.retries:>7}  "
            f"{report.usage.input_tokens:>9}  {report.usage.output_tokens:>10}"
        )
    usage = result.usage
    retries = sum(r.retries for r in result.reports)
    echo(
        f"{'total':<12} {result.calls:>5}  {result.failures:>6}  {retries:>7}  "
        f"{usage.input_tokens:>9}  {usage.output_tokens:>10}   wall {result.elapsed:.2f}s"
    )
    timed_out = sum(r.timed_out for r in result.reports)
    if timed_out:
        echo(
            f"timed out (may be billed): {timed_out} attempts got no answer before the "
            "client's timeout; the server may have billed them (tokens unknown)"
        )


@click.command()
@WORLD
@count_option("--ticks", default=1, help="How many ticks to run.")
@CONFIG
@SETTINGS
@PROVIDER
@click.option(
    "--depth",
    multiple=True,
    metavar="PHASE=N",
    help="Chain depth for a phase (phase1|phase2a|phase2b|phase4 or "
    "intentions|resolution|narrative|memory); repeatable.",
)
@click.option("--concurrency", type=click.IntRange(min=1), help="Max calls in flight.")
@click.option("--model", help=EVERY_PHASE_MODEL)
@click.option(
    "--base-url",
    help="Provider base URL, e.g. http://127.0.0.1:8000/v1; several servers (a pool): "
    "comma-separated.",
)
@click.option("--budget-usd", type=click.FloatRange(min=0), help="Cost cap for this run (USD).")
@click.option("--budget-tokens", type=click.IntRange(min=0), help="Token cap for this run.")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    help="Set the world's seed (world.json) before running; later ticks keep it.",
)
@click.option(
    "--stream",
    is_flag=True,
    help="Stream answers and show each place's narrative as it is written "
    "(Ctrl-C once stops the calls in flight; the tick resumes on the next run).",
)
@click.option(
    "--yes",
    is_flag=True,
    help="Approve what a policy asks (approve_above_usd) without a prompt; without it, a "
    "run with no terminal refuses and the tick is not committed.",
)
@click.option(
    "--batch",
    is_flag=True,
    help="Send each phase's calls as one OpenAI Batch API batch: half the price, answers "
    "within 24 h (stopped, the next run resumes polling the same batch).",
)
@workers_options
@click.option("--json", "as_json", is_flag=True, help=JSON_LINES_HELP)
def tick(
    world_dir: Path,
    ticks: int,
    config_file: Path | None,
    settings: tuple[str, ...],
    provider: str | None,
    depth: tuple[str, ...],
    concurrency: int | None,
    model: str | None,
    base_url: str | None,
    budget_usd: float | None,
    budget_tokens: int | None,
    seed: int | None,
    stream: bool,
    yes: bool,
    batch: bool,
    workers: str,
    executor: str,
    ray_address: str | None,
    as_json: bool,
) -> None:
    """Run TICKS ticks of a world, committing each."""
    from sim.cli.progress import Progress, StreamView
    from sim.engine.runner import Runner

    with json_errors("tick", as_json):
        shards = shard_count(workers, executor, ray_address)
        config = build_config(
            config_file,
            world_dir,
            provider,
            depth,
            concurrency,
            model=model,
            base_url=base_url,
            budget_usd=budget_usd,
            budget_tokens=budget_tokens,
            stream=stream or None,
            batch=batch or None,
            settings=settings,
        )
        progress = Progress(ticks)
        view = StreamView(world_dir) if stream and not as_json else None
        told: list[bool] = []  # the note that nothing streamed, once

        def on_event(event: LLMEvent) -> None:
            progress.on_event(event)
            if view is not None:
                view.on_event(event)

        def on_tick(result: TickResult) -> None:
            progress.on_tick(result)
            if as_json:
                emit(tick_document(result))
                return
            streamed = view.streamed if view is not None else set()
            if view is not None:
                if not streamed and result.narratives and not told:
                    told.append(True)
                    echo(
                        f"note: --stream: the {config.llm.provider} provider streamed nothing; "
                        "each place's narrative is shown when its tick ends",
                        err=True,
                    )
                view.reset()
            print_tick(result, streamed)

        runner = Runner(
            world_dir,
            config,
            events=on_event,
            on_phase=progress.on_phase,
            on_tick=on_tick,
            seed=seed,
            on_delta=view.on_delta if view is not None else None,
            approver=TerminalApprover(yes),
            on_batch=progress.on_batch,
            workers=shards,
            executor=executor,
            ray_address=ray_address,
        )
        progress.attach(runner)
        try:
            runner.run(ticks)
        finally:
            progress.total()


def _probe(config: Config, seed: int) -> ProbeResult:
    from sim.engine.probe import probe

    return probe(config, seed)


def _checked_config(
    config_file: Path | None,
    world_dir: Path,
    provider: str | None = None,
    base_url: str | None = None,
    model: str | None = None,
) -> Config:
    """The config ``sim check`` checks with. A config that is wrong does not hide the
    world's own problems: the world is read too (within the built-in limits), and every
    problem of both is reported at once (``InvalidWorld``)."""
    from sim.errors import InputError, InvalidWorld
    from sim.storage import Storage

    try:
        return build_config(config_file, world_dir, provider, model=model, base_url=base_url)
    except InputError as config_problem:
        problems = [config_problem]
        try:
            Storage(world_dir).load()
        except InvalidWorld as exc:
            problems += _with_templates(world_dir, exc.problems)
        except InputError as exc:
            problems += _with_templates(world_dir, [exc])
        if len(problems) == 1:
            raise
        raise InvalidWorld(problems) from config_problem


def _with_templates(world_dir: Path, problems: list[InputError]) -> list[InputError]:
    """A world's load problems and its prompt templates' syntax errors, each once: a
    world that does not load is not rendered, and would hide a broken template."""
    from sim.phases.check import template_syntax_problems

    seen = {str(p) for p in problems}
    return [*problems, *(p for p in template_syntax_problems(world_dir) if str(p) not in seen)]


def embedding_cache_warnings(config: Config, world_dir: Path) -> list[str]:
    """What of the world's provider-embeddings caches a tick would not use (a folder in a
    cache's place: an ``UnsafePath``, as the tick refuses it)."""
    memories = [config.memory, *(config.memory.for_phase(p) for p in config.memory.phases)]
    models = [
        m.embedding_model for m in memories if m.embeddings == "provider" and m.embedding_model
    ]
    if not models:
        return []
    from sim.mind.vectors import check_caches  # numpy: only for a world that uses them

    return check_caches(world_dir, models)


@click.command()
@WORLD
@CONFIG
@click.option("--provider", help="Probe this provider (overrides [llm] provider).")
@click.option("--base-url", help="Probe this base URL (overrides [llm] base_url).")
@click.option("--model", help="Probe this model (overrides each [phaseN] model).")
@click.option(
    "--probe",
    is_flag=True,
    help="Probe the configured endpoint (implied by --provider, --base-url, --model).",
)
@JSON_OPTION
def check(
    world_dir: Path,
    config_file: Path | None,
    provider: str | None,
    base_url: str | None,
    model: str | None,
    probe: bool,
    as_json: bool,
) -> None:
    """Validate a world, its config and the engine's state in it; write nothing.

    Calls nothing, unless asked to probe the endpoint (--probe, or --provider, --base-url,
    --model): then one small request tells whether it is reachable, takes the key, serves
    the model, which structured-output form it takes and how many requests it serves at
    once, before a tick is paid for.

    Exit 0 when a tick can run (repairs the next tick makes are listed), 2 otherwise.
    """
    from sim.config import endpoint, named_endpoints, phase_endpoints
    from sim.engine import deletions, repair
    from sim.errors import InvalidWorld
    from sim.interventions import describe, load_pending
    from sim.phases.check import check_phases
    from sim.policy import configured_policies
    from sim.storage import Storage
    from sim.ticklog.reader import check_log_slot
    from sim.ticklog.records import record_data
    from sim.ticklog.summary import check_history

    probing = probe or any(v is not None for v in (provider, base_url, model))
    with json_errors("check", as_json, read_only=True):
        config = _checked_config(config_file, world_dir, provider, base_url, model)
        url, key_env = endpoint(config)
        storage = Storage(world_dir, config.limits.max_entity_bytes)
        running = storage.running_elsewhere()
        storage.check_engine_dirs()
        try:
            world = storage.load()  # entities, prompts, a pending journal
        except InvalidWorld as exc:
            every = _with_templates(world_dir, exc.problems)
            if len(every) == len(exc.problems):
                raise
            raise InvalidWorld(every) from None
        policies = [p.name for p in configured_policies(config)]  # a custom one must load
        interventions = load_pending(world_dir, world).records  # sim inject / sim set, waiting
        check_log_slot(world_dir, world.tick + 1)  # the next tick refuses a FIFO or link there
        repairs = [str(item) for item in repair.inspect(world).items]
        pending_problem = deletions.problem(world_dir)
        if pending_problem is not None:
            repairs.append(
                f"{world_dir / deletions.PENDING}: {pending_problem}; the next tick sets it "
                "aside (its responses are left on the provider)"
            )
        phases = check_phases(config, world)
        phases.warnings += embedding_cache_warnings(config, world_dir)
        if not phases.ok:
            if as_json:
                emit(
                    {
                        "command": "check",
                        "ok": False,
                        "exit_code": 2,
                        "errors": phases.errors,
                        "warnings": phases.warnings,
                    }
                )
            for warning in phases.warnings:
                echo(f"warning: {warning}", err=as_json)
            for error in phases.errors:
                echo(f"error: {error}", err=True)
            sys.exit(2)
        if as_json:
            document = check_document(world_dir, config, storage, world)
            document["phases"] = [spec.name for spec in phases.phases]
            document["warnings"] = phases.warnings
            document["policies"] = policies
            document.update(endpoint=url, api_key_env=key_env, repairs=repairs, running=running)
            document["pending_interventions"] = [record_data(r) for r in interventions]
            document["phase_endpoints"] = {
                name: {"endpoint": u, "api_key_env": k}
                for name, (u, k) in phase_endpoints(config).items()
            }
            document["endpoints"] = {
                name: {"endpoint": u, "api_key_env": k}
                for name, (u, k) in named_endpoints(config).items()
            }
            if probing:
                probed = _probe(config, world.seed)
                document["probe"] = probed.to_dict()
                if not probed.ok:
                    document.update(ok=False, exit_code=2)
                    emit(document)
                    sys.exit(2)
            emit(document)
            return
        for warning in phases.warnings:
            echo(f"warning: {warning}")
        echo(
            f"ok: {world.meta['name']!r} at tick {world.tick}: {len(world.characters)} "
            f"characters, {len(world.locations)} locations; provider {config.llm.provider}"
        )
        echo(
            f"phases: {', '.join(spec.name for spec in phases.phases)} "
            f"({phases.renders} template renders checked)"
        )
        if policies:
            echo(f"policies: {', '.join(policies)} (docs/policies.md)")
        echo(f"endpoint: {url}")
        if key_env is not None:
            state = "set" if os.environ.get(key_env) else "not set"
            echo(f"api key: from ${key_env} ({state})")
        for name, (phase_url, phase_key) in phase_endpoints(config).items():
            state = "set" if phase_key and os.environ.get(phase_key) else "not set"
            key_note = f", api key from ${phase_key} ({state})" if phase_key else ""
            echo(f"endpoint of phase {name}: {phase_url}{key_note}")
        for name, (other_url, other_key) in named_endpoints(config).items():
            state = "set" if other_key and os.environ.get(other_key) else "not set"
            key_note = f", api key from ${other_key} ({state})" if other_key else ""
            echo(f"endpoint {name}: {other_url}{key_note}")
        if probing:
            probed = _probe(config, world.seed)
            echo(f"probe: {probed.endpoint}, model {probed.model!r} (one small request)")
            for what, finding in probed.lines:
                echo(f"  {what}: {finding}")
            if not probed.ok:
                echo("error: the endpoint probe failed; a tick would fail the same way", err=True)
                sys.exit(2)
        for line in repairs:
            echo(f"repair: {line}")
        for record in interventions:
            echo(f"pending for tick {world.tick + 1}: {describe(record)}")
        if running:
            echo(
                f"running: another sim process is running this world now (tick "
                f"{world.tick + 1}); run `sim check` again when it has finished"
            )
            return
        if storage.pending_journal():
            echo("note: an interrupted commit is pending; the next 'sim tick' completes it")
        history = check_history(world_dir, world.tick)
        if history.interrupted is not None:
            tick, logged = history.interrupted
            echo(
                f"note: tick {tick} was interrupted; the next 'sim tick' "
                f"resumes it ({logged} calls already logged)"
            )
        for problem in history.problems:
            echo(f"warning: unreadable log: {problem}")

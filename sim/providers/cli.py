"""The ``cli`` provider: a local command answers each call, reading the prompt on stdin
and writing the answer on stdout (``llm -m MODEL``, ``ollama run MODEL``, a script).

```toml
[llm]
provider = "cli"
command = ["llm", "-m", "{model}"]   # {model}: the phase's model, in any argument
```

One process per call, started without a shell (the command is a list: the program, then
its arguments) in a session of its own, with sim's environment (the command reads its own
keys), under a guard (``sim.lifeline.guarded``) that kills its process group when sim
dies, ``kill -9`` included: an orphaned call would go on to be paid for, its answer lost.
The prompt is the instructions, the JSON Schema the answer must validate against
(the chat provider's ``prompt`` form: ``sim.providers._structured``), the chain window's
earlier exchanges and the input, as one text. The answer is stdout, a surrounding code
fence removed, validated against the schema: an answer that does not fit is an
``LLMSchemaError``, which recovery retries with the validation error fed back.

The answer is what the command wrote on stdout by the time it exited; what it left
running in its group is then killed, and a pipe held open by a process outside the group
is not waited for past ``LINGER_SECONDS``.

Failures: a non-zero exit is an ``LLMSubprocessError`` with the exit status and the end of
stderr (not retried: a command that fails says why, and sending it again rarely helps); a
call that runs past its ``timeout_seconds`` is an ``LLMTimeoutError``, its whole process
group killed (what the command started too); so is a cancelled call's. A command that
writes more than ``MAX_OUTPUT_BYTES`` is stopped likewise. A program that cannot be found
is an ``LLMConfigurationError`` when the stack is built, before any call.

Token counts are estimated from the text (four characters a token): a command reports
none. Tool calling is not offered (``schema_of`` refuses a request with tools).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shlex
import shutil
import signal
from collections.abc import Sequence
from typing import Any

from sim.lifeline import guarded
from sim.llm.errors import LLMConfigurationError, LLMSubprocessError, LLMTimeoutError
from sim.llm.tokens import estimate_tokens
from sim.llm.tools import ToolCalls, schema_of
from sim.llm.types import AdapterResponse, ModelRequest, Usage
from sim.providers._adapter_common import Responder
from sim.providers._openai_common import validate_text
from sim.providers._strict_schema import to_strict_json_schema
from sim.providers._structured import answer_text, instructions_for
from sim.providers.profiles import CLI

#: the most a command may write on stdout for one answer (a runaway command is stopped)
MAX_OUTPUT_BYTES = 8 * 1024 * 1024
#: how much of stderr an error keeps (its end: where a program says what went wrong)
STDERR_KEPT = 4000
#: how long a killed command may take to be reaped
REAP_SECONDS = 5.0
#: how long stdout may stay open after the command exited and its group was killed (a
#: process that left the group may hold it): what came by then is the answer
LINGER_SECONDS = 1.0
#: what ``{model}`` in an argument becomes
MODEL_PLACEHOLDER = "{model}"


def prompt_text(request: ModelRequest, instructions: str) -> str:
    """The one text a command reads: the instructions (with the schema), then the chain
    window's exchanges, oldest first, then the input."""
    parts = [instructions.rstrip()]
    for n, exchange in enumerate(request.history, 1):
        parts.append(
            f"[earlier exchange {n}]\nInput:\n{exchange.input}\nYour answer:\n{exchange.output}"
        )
    if request.history:
        parts.append(f"[now]\nInput:\n{request.input}")
    else:
        parts.append(request.input)
    return "\n\n".join(part for part in parts if part) + "\n"


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the command and everything in its group (its guard leads it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class _Watched(asyncio.subprocess.SubprocessStreamProtocol):
    """A process's pipes as streams, and ``exited``: set when the process itself exits,
    whether or not something it started still holds its pipes (``Process.wait`` waits
    for those too)."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _stop(
    process: asyncio.subprocess.Process,
    protocol: _Watched,
    transport: asyncio.SubprocessTransport,
    readers: tuple[asyncio.Future[Any], ...],
) -> None:
    """Stop the command and its group, wait (briefly) for the end and close the transport.

    Its pipes are not waited for: a descendant that left the group may hold them open.
    Closing the transport here, on its loop, leaves nothing for a later garbage
    collection to close on a loop that is gone ("Event loop is closed").
    """
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    if not protocol.exited.done():
        # the guard kills the command and reaps it, then their group (``sim.lifeline``)
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REAP_SECONDS):
                await asyncio.shield(protocol.exited)
    _kill_group(process)  # whatever is left of the group, the guard itself if it hung
    transport.close()


class _TooMuchOutput(Exception):
    pass


async def _read_capped(stream: asyncio.StreamReader | None, limit: int, into: bytearray) -> None:
    """Everything ``stream`` gives until EOF, into ``into``; ``_TooMuchOutput`` past
    ``limit`` bytes."""
    while stream is not None and (chunk := await stream.read(65536)):
        into += chunk
        if len(into) > limit:
            raise _TooMuchOutput


async def _read_tail(stream: asyncio.StreamReader | None, keep: int, into: bytearray) -> None:
    """The last ``keep`` bytes of ``stream``, into ``into`` (read to EOF, so the command
    never blocks)."""
    while stream is not None and (chunk := await stream.read(65536)):
        into += chunk
        del into[:-keep]


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the prompt and close stdin; a command that exits without reading it all is
    not an error here (its exit status says how it went)."""
    stdin = process.stdin
    if stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
    stdin.close()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await stdin.wait_closed()


def model_argument_problem(command: Sequence[str], model: str) -> str | None:
    """Why ``model`` cannot be put in ``command``'s ``{model}`` (``None``: it can): it
    would be read as an option (it starts with ``-``) or cannot be an argument (a NUL, or
    nothing). A model name comes from a phase's config, which a world may set, and must not
    add options to your command. A command without ``{model}`` takes any name (a label).
    ``sim.config`` checks every phase's models with it when the config loads."""
    if not any(MODEL_PLACEHOLDER in arg for arg in command):
        return None
    if model.startswith("-") or "\x00" in model or not model.strip():
        return (
            f"model {model!r} cannot be passed to the command: a model name for a "
            '"cli" provider must not be empty, start with "-" or hold a NUL'
        )
    return None


class CLIAdapter(Responder):
    """Runs ``command`` once per call (see the module docstring).

    Args:
        command: the program and its arguments; ``{model}`` in an argument is replaced by
            the call's model.
        timeout_seconds: the default deadline of one call; each call uses its settings'.

    Raises:
        LLMConfigurationError: no command, or its program is not found.
    """

    name = "cli"
    profile = CLI

    def __init__(self, command: Sequence[str] = (), *, timeout_seconds: float = 600.0) -> None:
        if not command or not command[0].strip():
            raise LLMConfigurationError(
                'provider "cli" needs a command: set [llm] command (or command in a '
                '[providers.NAME] table with kind = "cli"), e.g. ["llm", "-m", "{model}"]'
            )
        program = command[0]
        if shutil.which(program) is None:
            raise LLMConfigurationError(
                f'provider "cli": the command\'s program {program!r} was not found '
                "(not on PATH, or not an executable file); check command in config.toml"
            )
        self.command = tuple(command)
        self.timeout_seconds = timeout_seconds

    def argv(self, model: str) -> list[str]:
        """The command line for a call to ``model``.

        Raises:
            LLMConfigurationError: ``model`` would be read as an option (it starts with
                ``-``) or cannot be an argument (a NUL): a model name comes from a phase's
                config, which a world may set, and must not add options to your command.
        """
        problem = model_argument_problem(self.command, model)
        if problem is not None:
            raise LLMConfigurationError(problem, model=model)
        return [arg.replace(MODEL_PLACEHOLDER, model) for arg in self.command]

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        settings = request.settings
        model = settings.model
        schema = schema_of(self, request)  # no tool calling: a request with tools fails here
        json_schema = to_strict_json_schema(schema)
        prompt = prompt_text(request, instructions_for("prompt", request.instructions, json_schema))
        out = await self.run(self.argv(model), prompt, settings.timeout_seconds, model)
        text = out.decode("utf-8", errors="replace")
        usage = Usage(estimate_tokens(prompt), estimate_tokens(text))
        digest = hashlib.blake2b(digest_size=12)
        digest.update(prompt.encode())
        digest.update(b"\x00")
        digest.update(out)
        return self.respond(
            request,
            usage,
            ToolCalls,  # never called: a request with tools was refused above
            lambda schema: validate_text(
                schema, answer_text("prompt", {"content": text}), usage, model
            ),
            response_id=f"cli_{digest.hexdigest()}",
            model=model,
            structured_output="prompt",
        )

    async def run(self, argv: list[str], prompt: str, timeout: float, model: str) -> bytes:
        """Run one call's process: its stdout, or the error it ended in.

        The answer is what the command wrote by the time it exited: what it left running
        in its group is then stopped, and a process outside it that still holds stdout
        open is not waited for past ``LINGER_SECONDS``.
        """
        shown = shlex.join(argv)
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _Watched(limit=2**16, loop=loop),
                *guarded(argv),  # dies with sim, kill -9 included, and takes its group along
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills it all
            )
        except OSError as exc:
            raise LLMSubprocessError(
                f"cannot start {shown}: {exc.strerror or exc}",
                cause=exc,
                model=model,
                context={"command": argv},
            ) from exc
        process = asyncio.subprocess.Process(transport, protocol, loop)
        out, err = bytearray(), bytearray()
        stdout = asyncio.ensure_future(_read_capped(process.stdout, MAX_OUTPUT_BYTES, out))
        readers = (
            stdout,
            asyncio.ensure_future(_read_tail(process.stderr, STDERR_KEPT, err)),
            asyncio.ensure_future(_feed(process, prompt.encode())),
        )
        try:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.wait(
                        (protocol.exited, stdout), return_when=asyncio.FIRST_COMPLETED
                    )
                    if stdout.done():
                        stdout.result()  # too much output raises here
                    # the command itself, not what it left running (shielded: a timeout
                    # or a cancel must not cancel the future the process's end sets)
                    await asyncio.shield(protocol.exited)
            except TimeoutError as exc:
                raise LLMTimeoutError(
                    f"{shown} did not answer within {timeout:g} s; it was stopped",
                    cause=exc,
                    model=model,
                    context={"command": argv, "timeout_seconds": timeout},
                ) from None
            _kill_group(process)  # what it left running: its pipes then close
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINGER_SECONDS):
                    await asyncio.gather(*readers[:2])
            if len(out) > MAX_OUTPUT_BYTES:
                raise _TooMuchOutput
        except _TooMuchOutput:
            raise LLMSubprocessError(
                f"{shown} wrote more than {MAX_OUTPUT_BYTES} bytes; it was stopped",
                model=model,
                context={"command": argv},
            ) from None
        finally:
            # done, failed or cancelled (Ctrl-C): nothing the command started outlives it
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(_stop(process, protocol, transport, readers))
        code = process.returncode
        if code != 0:
            stderr = bytes(err).decode("utf-8", errors="replace").strip()
            status = (
                "no status"
                if code is None
                else (f"signal {-code}" if code < 0 else f"status {code}")
            )
            raise LLMSubprocessError(
                f"{shown} exited with {status}" + (f": {stderr}" if stderr else ""),
                return_code=code,
                stderr=stderr,
                model=model,
                context={"command": argv},
            )
        return bytes(out)

    async def delete_response(self, response_id: str) -> None:
        """A command keeps nothing: nothing to delete."""
        return None

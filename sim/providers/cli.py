"""The ``cli`` provider: a local command answers each call, reading the prompt on stdin
and writing the answer on stdout (``llm -m MODEL``, ``ollama run MODEL``, a script).

```toml
[llm]
provider = "cli"
command = ["llm", "-m", "{model}"]   # {model}: the phase's model, in any argument
```

One process per call, started without a shell (the command is a list: the program, then
its arguments) in a session of its own, with sim's environment (the command reads its own
keys). The prompt is the instructions, the JSON Schema the answer must validate against
(the chat provider's ``prompt`` form: ``sim.providers._structured``), the chain window's
earlier exchanges and the input, as one text. The answer is stdout, a surrounding code
fence removed, validated against the schema: an answer that does not fit is an
``LLMSchemaError``, which recovery retries with the validation error fed back.

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
#: how long a stopped command's pipes may take to close once its group is killed
REAP_SECONDS = 5.0
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
    """SIGKILL the command and everything in its session (it leads its own group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _drain(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.read(65536):
        pass


async def _stop(
    process: asyncio.subprocess.Process, readers: tuple[asyncio.Future[Any], ...]
) -> None:
    """Kill the command's group and reap it.

    Its pipes are read to EOF first: a reader that stopped early leaves a full buffer,
    asyncio then pauses that pipe, and ``Process.wait()`` (which waits for every pipe to
    close) would never return. A descendant that left the group and still holds a pipe
    cannot keep the call waiting longer than ``REAP_SECONDS``.
    """
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    _kill_group(process)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REAP_SECONDS):
            await asyncio.gather(_drain(process.stdout), _drain(process.stderr))
            await process.wait()


class _TooMuchOutput(Exception):
    pass


async def _read_capped(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    """Everything ``stream`` gives until EOF; ``_TooMuchOutput`` past ``limit`` bytes."""
    if stream is None:
        return b""
    out = bytearray()
    while chunk := await stream.read(65536):
        out += chunk
        if len(out) > limit:
            raise _TooMuchOutput
    return bytes(out)


async def _read_tail(stream: asyncio.StreamReader | None, keep: int) -> bytes:
    """The last ``keep`` bytes of ``stream`` (read to EOF, so the command never blocks)."""
    if stream is None:
        return b""
    tail = b""
    while chunk := await stream.read(65536):
        tail = (tail + chunk)[-keep:]
    return tail


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
        """Run one call's process: its stdout, or the error it ended in."""
        shown = shlex.join(argv)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
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
        readers = (
            asyncio.ensure_future(_read_capped(process.stdout, MAX_OUTPUT_BYTES)),
            asyncio.ensure_future(_read_tail(process.stderr, STDERR_KEPT)),
            asyncio.ensure_future(_feed(process, prompt.encode())),
        )
        try:
            async with asyncio.timeout(timeout):
                out, err, _ = await asyncio.gather(*readers)
                code = await process.wait()
        except TimeoutError as exc:
            await _stop(process, readers)
            raise LLMTimeoutError(
                f"{shown} did not answer within {timeout:g} s; it was stopped",
                cause=exc,
                model=model,
                context={"command": argv, "timeout_seconds": timeout},
            ) from None
        except _TooMuchOutput:
            await _stop(process, readers)
            raise LLMSubprocessError(
                f"{shown} wrote more than {MAX_OUTPUT_BYTES} bytes; it was stopped",
                model=model,
                context={"command": argv},
            ) from None
        except BaseException:  # cancelled (Ctrl-C): nothing the command started outlives it
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(_stop(process, readers))
            raise
        if code != 0:
            stderr = err.decode("utf-8", errors="replace").strip()
            status = f"signal {-code}" if code < 0 else f"status {code}"
            raise LLMSubprocessError(
                f"{shown} exited with {status}" + (f": {stderr}" if stderr else ""),
                return_code=code,
                stderr=stderr,
                model=model,
                context={"command": argv},
            )
        return out

    async def delete_response(self, response_id: str) -> None:
        """A command keeps nothing: nothing to delete."""
        return None

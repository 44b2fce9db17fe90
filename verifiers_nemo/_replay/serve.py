"""``verifiers-nemo replay-server ENV``: the replay policy as a standalone OpenAI-compatible server.

A GPU-free smoke test of a whole verifiers chain (``vf-eval`` → our harness → the real Gym stack →
verifiers' interception → this server): point ``--client.base-url`` at the printed URL and run the
taskset with ``recorded=true``. Each rollout names its recorded row in a header that verifiers'
interception forwards (it forwards ``X-`` headers), so rows whose inputs repeat are told apart.
"""

from __future__ import annotations

import threading
from pathlib import Path

from .._exceptions import ConfigurationError
from .._signals import capture_signals
from .._tasks import NeMoGymTaskset
from .recordings import REPLAY_MODEL
from .server import ReplayServer


def replay_server(
    nemo_env: str | None, *, jsonl_path: str | Path | None = None, gym_python: str | None = None
) -> ReplayServer:
    """A (not yet started) replay server for the recorded rollouts of ``nemo_env`` (or a file)."""
    from .._gym import gym_root

    root = gym_root(gym_python) if nemo_env else None
    return ReplayServer.from_tasks(NeMoGymTaskset(nemo_env, jsonl_path=jsonl_path, recorded=True, root=root))


def serve_forever(server: ReplayServer, *, nemo_env: str | None = None, port_file: str | None = None) -> int:
    """Serve until SIGINT/SIGTERM; print the base URL (and write it to ``port_file``)."""
    stopped = threading.Event()
    with capture_signals(lambda sig, count: stopped.set(), reraise=False):
        server.start()
        base_url = f"{server.url}/v1"
        print(f"Replaying {len(server.recordings)} recorded rollouts at {base_url} (model {REPLAY_MODEL!r})")
        print(
            f"  vf-eval nemo-gym-env -m {REPLAY_MODEL} --client.base-url {base_url} --env.taskset.recorded true "
            f"--env.taskset.nemo-env {nemo_env or 'ENV --env.taskset.jsonl-path FILE'}",
            flush=True,
        )
        try:
            if port_file:
                _write_port_file(Path(port_file), base_url)
            stopped.wait()
        finally:
            server.stop()
    return 0


def _write_port_file(path: Path, base_url: str) -> None:
    """The base URL in ``path`` (its folder made), whole or not at all: a reader polling for it never sees half."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(base_url)
        partial.replace(path)
    except OSError as exc:
        raise ConfigurationError(
            f"--port-file {path}: cannot write it ({exc.strerror}). Fix: name a file in a folder you can write."
        ) from None

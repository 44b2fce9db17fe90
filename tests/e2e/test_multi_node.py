"""The multi-node block of docs/guides/ray.md, run on two Ray nodes: two network namespaces of this machine joined
by a veth pair, each a node with its own address, home (Ray's token), Ray temporary folder and Ray head for Gym stacks.

Every line of the block runs where its comment says (``# on the head node``, ``# on every other node``, ``# on every
node``), its placeholders substituted: ``HEAD_IP`` / ``NODE_IP`` the namespaces' addresses, ``--workers 16`` as
``--workers 2`` (one actor a node), the vLLM a replay server of the environment's recordings in the head's namespace
(``-m replay``, and ``--api responses``: it serves the Responses API; tests/e2e/held_replay.py), which never answers
the calls of the other node: that node's rollouts are in flight when every process of its namespace is SIGKILLed.
The eval must finish with every row saved once and every recorded reward reproduced (the lost rollouts retried on
the head's actor), and nothing of the dead node left.

The environment runs as a folder of the user's own (docs/guides/own-environment.md, "Ray"): a copy of the guide's
``example_multi_step`` outside the Gym install, named by its path (which wins over the packaged name), at the same
path on both nodes as a shared filesystem gives it.

Only addresses inside the namespaces made here, and their loopback, are used: nothing binds the machine's own
network. Needs root (``ip netns``), as CI runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

from tests.e2e.test_docs import ROOT as REPO
from tests.e2e.test_docs import substitute
from tests.faults.helpers import cmdline_of
from verifiers_nemo import NeMoGymTaskset, Task
from verifiers_nemo._gym import cache_dir
from verifiers_nemo._tasks.recorded import input_key

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # the venv that runs --ray: its Ray starts the nodes
ENV = "example_multi_step"
POLICY_PORT = 8000
WORKERS = 2
GUIDE = "docs/guides/ray.md"
DEADLINE_S = 300
LEAN_RAY = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""Ray's idle work left out on both nodes (no workers started ahead of need, no usage report), as for the suite's own
Ray heads: it changes nothing this test checks, and two nodes share two cores."""
WHERE = {"on the head node": ("head",), "on every other node": ("worker",), "on every node": ("head", "worker")}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Node:
    """One Ray node: a network namespace and what its processes are given."""

    name: str
    netns: str
    address: str
    folder: Path
    exports: list[str] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.folder / "home"

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VERIFIERS_NEMO_RAY", "PYTEST"))}
        env |= {
            "PATH": os.pathsep.join([str(VENV_BIN), env.get("PATH", "")]),
            "HOME": str(self.home),  # Ray's token lives in ~/.ray: each node has its own
            "RAY_TMPDIR": str(self.folder / "ray"),
            "VERIFIERS_NEMO_RAY_DIR": str(self.folder / "gym-ray"),
            "VERIFIERS_NEMO_CACHE_DIR": str(cache_dir()),  # the runtime and packages `prepare` built, shared
            **LEAN_RAY,
        }
        return env

    def popen(self, line: str, cwd: Path, **kwargs: object) -> subprocess.Popen[str]:
        script = "\n".join([*self.exports, line])
        argv = ["ip", "netns", "exec", self.netns, "bash", "-e", "-o", "pipefail", "-c", script]
        return subprocess.Popen(argv, cwd=cwd, env=self.environ(), text=True, **kwargs)  # type: ignore[call-overload]

    def pids(self) -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, timeout=30)
        return [int(pid) for pid in listed.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILL every process of the namespace, until none is left (a dying parent may start one more)."""
        deadline = time.monotonic() + 60
        while pids := self.pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            assert time.monotonic() < deadline, f"processes of {self.netns} survive SIGKILL: {pids}"
            time.sleep(0.05)

    def listening(self) -> list[str]:
        found = subprocess.run(["ip", "netns", "exec", self.netns, "ss", "-Htln"], capture_output=True, text=True)
        return found.stdout.splitlines()


@pytest.fixture
def nodes() -> Iterator[dict[str, Node]]:
    """Two namespaces joined by a veth pair (an address each, loopback up); every process in them killed and both
    deleted at the end, whatever happened."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make network namespaces (CI runs as root)")
    tag = f"vn{os.getpid()}{secrets.token_hex(3)}"
    folder = Path(tempfile.mkdtemp(prefix="vnmn-"))  # short: Ray's socket paths live under it
    made = {
        name: Node(name, f"{tag}{name[0]}", f"10.254.0.{i}", folder / name) for i, name in ((1, "head"), (2, "worker"))
    }
    try:
        for node in made.values():
            _ip("netns", "add", node.netns)
            node.home.mkdir(parents=True)
        head, worker = made["head"], made["worker"]
        _ip("link", "add", "eth0", "netns", head.netns, "type", "veth", "peer", "name", "eth0", "netns", worker.netns)
        for node in made.values():
            _ip("-n", node.netns, "link", "set", "lo", "up")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "eth0", "up")
        yield made
    finally:
        for node in made.values():
            try:
                node.kill_all()
            finally:
                subprocess.run(["ip", "netns", "delete", node.netns], capture_output=True, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def _block() -> tuple[str, str]:
    """The Ray guide's multi-node block and the reason the docs runner leaves it to this test."""
    [block] = [b for b in extract_from_file(REPO / GUIDE) if b.syntax == "bash" and "--ray HEAD_IP" in b.code]
    reasons = [re.search(r'reason="([^"]*)"', mark) for mark in block.marks]
    return block.code, next(m.group(1) for m in reasons if m)


def _own_copy(folder: Path) -> Path:
    """The guide's environment as a folder of the user's own: a copy outside the Gym install (the same files)."""
    from verifiers_nemo import get_environment

    packaged = get_environment(ENV)
    copy = folder / "project" / "resources_servers" / ENV
    shutil.copytree(packaged.directory, copy, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    return copy


def _lines(code: str, head: Node, env: str = ENV) -> list[tuple[str, tuple[str, ...]]]:
    """Each line of the block with the nodes its comment names, placeholders substituted (NODE_IP: per node)."""
    placeholders = {
        "HEAD_IP": head.address,
        "http://vllm:8000/v1": f"http://{head.address}:{POLICY_PORT}/v1",
        "Qwen/Qwen3-8B": "replay",
        "--api chat": "--api responses",  # the stand-in is the replay server's app: the Responses API only
        "16": str(WORKERS),
        ENV: env,  # last: the folder's path is substituted into nothing else
    }
    lines = []
    for raw in code.strip().splitlines():
        command, _, comment = raw.partition("#")
        where = next((nodes for text, nodes in WHERE.items() if comment.strip().startswith(text)), None)
        assert where is not None, f"the guide's multi-node line {raw!r} does not say where it runs"
        lines.append((substitute(command.strip(), placeholders), where))
    return lines


def _start_policy(head: Node, folder: Path, hold: str, env: str = ENV) -> subprocess.Popen[str]:
    """The stand-in vLLM in the head's namespace (tests/e2e/held_replay.py); ``_listening`` waits for it."""
    argv = [sys.executable, str(ROOT / "tests/e2e/held_replay.py"), env, head.address, str(POLICY_PORT)]
    argv += [str(folder / "calls"), hold, str(folder / "policy.ready")]
    with (folder / "policy.log").open("w") as log:  # the child keeps its own copy of the file
        return subprocess.Popen(
            ["ip", "netns", "exec", head.netns, *argv], cwd=ROOT, env=head.environ(), stdout=log, stderr=log, text=True
        )


def _listening(policy: subprocess.Popen[str], folder: Path) -> None:
    deadline = time.monotonic() + 120
    while not (folder / "policy.ready").exists():
        assert policy.poll() is None, (folder / "policy.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the replay server did not listen within 120 s"
        time.sleep(0.1)


def _callers(folder: Path) -> set[str]:
    path = folder / "calls"
    return set(path.read_text().split()) if path.exists() else set()


def test_the_readme_multi_node_block_loses_nothing_when_a_node_dies_mid_run(
    nodes: dict[str, Node],
) -> None:
    head, worker = nodes["head"], nodes["worker"]
    code, reason = _block()
    assert "tests/e2e/test_multi_node.py" in reason and f"--workers {WORKERS}" in reason and "-m replay" in reason
    assert "--api responses" in reason
    folder = head.folder.parent
    run_dir = folder / "run"
    run_dir.mkdir()
    own = str(_own_copy(folder))
    policy = _start_policy(head, folder, hold=worker.address, env=own)  # starts while the nodes do

    eval_proc = None
    for line, where in _lines(code, head, own):
        if (head.home / ".ray/auth_token").exists() and not (worker.home / ".ray/auth_token").exists():
            (worker.home / ".ray").mkdir()  # "copy its ~/.ray/auth_token to every node"
            shutil.copy(head.home / ".ray/auth_token", worker.home / ".ray/auth_token")
        here = [nodes[name] for name in where]
        if line.startswith("export "):
            for node in here:
                node.exports.append(line)
        elif " eval " in line:
            assert where == ("head",)
            _listening(policy, folder)
            eval_proc = head.popen(line, run_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        else:
            procs = [(n, n.popen(line.replace("NODE_IP", n.address), run_dir, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)) for n in here]  # fmt: skip
            for node, proc in procs:
                output, _ = proc.communicate(timeout=DEADLINE_S)
                assert proc.returncode == 0, f"{node.name}: {line}\n{output[-4000:]}"
    assert eval_proc is not None, "the block runs no eval"

    deadline = time.monotonic() + DEADLINE_S
    while worker.address not in _callers(folder):  # the worker node's actor has rollouts in flight
        if eval_proc.poll() is not None or time.monotonic() > deadline:
            out, err = eval_proc.communicate(timeout=60)
            pytest.fail(f"no policy call came from the worker node's actor:\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.1)
    worker.kill_all()  # the node dies: its raylet, the actor, its Gym stack and Ray head, all at once
    out, err = eval_proc.communicate(timeout=DEADLINE_S)

    assert eval_proc.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    assert _callers(folder) == {head.address, worker.address}  # actors on both nodes ran rollouts
    assert "is gone" in err  # the pool saw the worker node's actor die
    assert f"your folder {own}" in out  # the copy ran, not the packaged environment
    recorded = {_input(t): t.recorded_reward for t in NeMoGymTaskset(own, recorded=True)}
    dataset = list(NeMoGymTaskset(own))
    [results] = run_dir.glob("outputs/evals/*/*/results.jsonl")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["task_index"] for r in rows) == list(range(len(dataset)))  # every row saved, once
    for row in rows:  # none lost: each one retried on the head's actor, its recorded reward reproduced
        expected = recorded[_input(dataset[row["task_index"]])]
        assert (row["error"], row["reward"]) == (None, expected), row
    assert len({row["worker"] for row in rows}) == 1, rows  # all of them on the one actor left: the head's
    assert f"{len(dataset)} of {len(dataset)}" in out and f"{len(dataset)} scored" in out, out[-3000:]

    assert worker.pids() == [] and worker.listening() == []  # nothing of the dead node left
    leftovers = [p for p in head.pids() if re.search(r"ng_run|app\.py|_gym_side|StackWorker|vnr-ray-", cmdline_of(p))]
    assert leftovers == [], [cmdline_of(p) for p in leftovers]  # the head's actor and its Gym stack closed too


def _input(task: Task) -> str:
    return input_key(task.row["responses_create_params"]["input"])

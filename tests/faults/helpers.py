"""Shared pieces of the fault-injection suite: figures, task rows, scripted upstreams, /proc scanning."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import os
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.e2e.policies import counter_policy, function_call, message, user_text
from tests.e2e.test_harness import ENV as COUNTER_ENV
from tests.e2e.test_harness import _counter_rows

__all__ = ["COUNTER_ENV"]

# -- the suite's bounds and canary -------------------------------------------------------------

UPSTREAM_TIMEOUT = 6.0
"""The proxy's bound on one policy call, all retries included (the default is 600 s)."""
MAX_RETRIES, BACKOFF, BACKOFF_MAX = 3, 0.5, 8.0
"""The proxy's retry defaults, spelled out: 3 retries, 0.5 s doubling up to 8 s (x0.5-1 jitter)."""
ROLLOUT_TIMEOUT = 30.0

CANARY = f"sk-canary-{secrets.token_hex(16)}"
"""A unique fake API key: endpoints use it, and it sits in this process's environment."""
CANARY_ENV_VAR = "MY_SERVICE_API_KEY"

# -- figures -----------------------------------------------------------------------------------

FIGURES: list[tuple[str, dict[str, Any]]] = []
"""(test, figures) in the order recorded; printed at the end of the run by conftest."""


def record_figures(test: str, **figures: Any) -> None:
    """Keep a test's figures for the end-of-run summary and print them (shown with -s / -rP)."""
    FIGURES.append((test, figures))
    print(f"FIGURES {test}: {format_figures(figures)}")


def format_figures(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k}={f'{v:.2f}' if isinstance(v, float) else v}" for k, v in figures.items())


# -- tasks -------------------------------------------------------------------------------------

TASK_TAG = re.compile(r"^task-(\d+): ")


def tagged_counter_rows(path: Path, count: int, seed: int = 7) -> list[float]:
    """tests/e2e/test_harness.py's counter tasks, each prompt prefixed with ``task-<i>: `` so that any
    upstream can tell which rollout a call belongs to (and every request is unique)."""
    expected = _counter_rows(path, count, seed)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for index, row in enumerate(rows):
        for item in row["responses_create_params"]["input"]:
            if item.get("role") == "user":
                item["content"] = f"task-{index}: {item['content']}"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return expected


def identity_rows(path: Path, count: int, upstreams: int) -> list[float]:
    """Counter tasks whose right answer depends on which upstream serves them: upstream ``k`` (task
    ``i`` belongs to ``k = i % upstreams``) increments the counter by ``k + 1``. A call delivered to
    the wrong upstream therefore changes the reward. Every fifth task expects a wrong count (reward 0).
    """
    from verifiers_nemo import get_environment

    example = json.loads(get_environment(COUNTER_ENV).default_dataset.path.read_text().splitlines()[0])
    tools = example["responses_create_params"]["tools"]
    expected = []
    with open(path, "w") as f:
        for i in range(count):
            right = i % 5 != 0
            row = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"task-{i}: add your number then say who you are"}],
                    "tools": tools,
                },
                "initial_count": i,
                "expected_count": i + (i % upstreams) + 1 + (0 if right else 1),
                "id": f"identity-{i}",
            }
            f.write(json.dumps(row) + "\n")
            expected.append(1.0 if right else 0.0)
    return expected


def task_of(body: dict[str, Any]) -> int:
    match = TASK_TAG.match(user_text(body))
    assert match, user_text(body)
    return int(match.group(1))


def has_tool_output(body: dict[str, Any]) -> bool:
    items = body["input"] if isinstance(body["input"], list) else []
    return any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)


# -- scripted upstreams (handlers for tests.e2e.policies.PolicyServer) ---------------------------


class IdentityPolicy:
    """Upstream ``index`` of ``count``: increments the counter by ``index + 1``, then says who it is.
    Counts calls whose task belongs to another upstream (cross-routed)."""

    def __init__(self, index: int, count: int) -> None:
        self.index, self.count = index, count
        self.name = f"upstream-{index}"
        self.cross_routed = 0
        self.tasks: Counter[int] = Counter()

    async def __call__(self, body: dict[str, Any], request: web.Request) -> list[dict[str, Any]]:
        task = task_of(body)
        self.tasks[task] += 1
        if task % self.count != self.index:
            self.cross_routed += 1
        if not has_tool_output(body):
            return [function_call("increment_counter", {"count": self.index + 1})]
        return [message(f"I am {self.name} (model {body.get('model')}), serving task-{task}.")]


class FlakyPolicy:
    """Refuses the first ``failures`` attempts of every distinct request with 500, 429, 503 in turn,
    then answers as ``counter_policy``. Counts the faults it injected."""

    STATUSES = (500, 429, 503)

    def __init__(self, failures: int = 2) -> None:
        self.failures = failures
        self.seen: Counter[str] = Counter()
        self.injected: Counter[int] = Counter()

    async def __call__(self, body: dict[str, Any], request: web.Request) -> Any:
        digest = hashlib.sha256(json.dumps(body["input"], sort_keys=True).encode()).hexdigest()
        attempt = self.seen[digest]
        self.seen[digest] += 1
        if attempt < self.failures:
            status = self.STATUSES[(attempt + int(digest[:8], 16)) % len(self.STATUSES)]
            self.injected[status] += 1
            headers = {"Retry-After": "0.1"} if status == 429 else {}
            return web.json_response({"error": {"message": "flaky", "code": status}}, status=status, headers=headers)
        return await counter_policy(body, request)


class BrokenPolicy:
    """Never heals: answers every call with 500, 429 (Retry-After given) or 503 in turn."""

    def __init__(self, retry_after: str = "0") -> None:
        self.retry_after = retry_after
        self.injected: Counter[int] = Counter()

    async def __call__(self, body: dict[str, Any], request: web.Request) -> web.Response:
        status = FlakyPolicy.STATUSES[sum(self.injected.values()) % 3]
        self.injected[status] += 1
        headers = {"Retry-After": self.retry_after} if status == 429 else {}
        return web.json_response(
            {"error": {"message": "down for good", "code": status}}, status=status, headers=headers
        )


class HangPolicy:
    """Accepts every call and never answers, holding it until the caller gives up and closes the
    connection; ``open`` is how many calls a caller still holds open."""

    def __init__(self) -> None:
        self.received = 0
        self.open = 0

    async def __call__(self, body: dict[str, Any], request: web.Request) -> web.Response:
        self.received += 1
        self.open += 1
        try:
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.05)  # a hung server: it only notices that the caller left
        finally:
            self.open -= 1
        return web.Response(status=499)


# -- polling -----------------------------------------------------------------------------------


async def until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` on the running loop until truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s (last value {value!r})")
        await asyncio.sleep(interval)


# -- /proc: processes, environments, listening sockets ------------------------------------------


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def environ_of(pid: int) -> bytes:
    return _read(f"/proc/{pid}/environ")


def cmdline_of(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pids_with_env(marker: str) -> list[int]:
    """Live processes (not this one) whose environment holds ``marker``: what a child started with
    it in its environment left behind, however it was reparented."""
    needle = marker.encode()
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        stat = _read(f"/proc/{pid}/stat")
        if not stat or stat[stat.rfind(b")") + 2 :].split()[0] == b"Z":
            continue
        if needle in environ_of(pid):
            found.append(pid)
    return found


def held_helper_sessions() -> set[int]:
    """The sessions of this user's shared Gym helpers (Ray heads, warm parents: ``ray_dir()``) that a process still
    holds (a lease locked by its holder): a run that started one leaves it running, rightly, while another process
    (another test's, the suite's own hold) has joined it."""
    import fcntl

    from verifiers_nemo._stack.leases import read_state
    from verifiers_nemo._stack.ray_head import ray_dir

    held = set()
    for folder in ray_dir().iterdir():
        state = read_state(folder / ("state.json" if folder.name.startswith("warm-") else "head.json"))
        if state is None or not isinstance(state.get("pid"), int):
            continue
        for lease in (folder / "leases").glob("*"):
            try:
                with open(lease) as f:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                held.add(state["pid"])
                break
            except OSError:
                continue
    return held


def session_of(pid: int) -> int:
    """The session of process ``pid`` (0 when it is gone)."""
    try:
        return os.getsid(pid)
    except OSError:
        return 0


def children_of(pid: int) -> list[int]:
    out = []
    for child in all_pids():
        stat = _read(f"/proc/{child}/stat")
        if stat and int(stat[stat.rfind(b")") + 2 :].split()[1]) == pid:
            out.append(child)
    return out


@dataclass(frozen=True)
class ListeningSocket:
    inode: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def loopback(self) -> bool:
        address = self.address
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback

    def __str__(self) -> str:
        return f"{self.address}:{self.port}"


def listening_sockets() -> dict[str, ListeningSocket]:
    """Every listening TCP socket on this host (/proc/net/tcp and tcp6), by inode."""
    sockets = {}
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in _read(table).decode().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            # the kernel prints each 32-bit word in host (little-endian) order
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            address = ipaddress.ip_address(packed)
            sockets[fields[9]] = ListeningSocket(fields[9], address, int(hex_port, 16))
    return sockets


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listening_sockets_of(pids: list[int]) -> list[tuple[int, str, ListeningSocket]]:
    """(pid, command line, socket) for every listening TCP socket the processes hold."""
    table = listening_sockets()
    found = []
    for pid in pids:
        command = cmdline_of(pid)
        for inode in socket_inodes(pid):
            if inode in table:
                found.append((pid, command, table[inode]))
    return found

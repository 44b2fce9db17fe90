"""Where the suite's time goes: a pytest plugin that prints, at the end of every run, per test file, its wall
and CPU seconds and how many Gym stacks and Ray heads it started (``tests/conftest.py`` registers it).

Columns of the table (one row per test file, the slowest first):

* ``wall s``: the sum of the setup, call and teardown durations pytest reports for the file's tests. A fixture's
  setup counts for the first test that uses it, its teardown for the test after which it is torn down (a
  session fixture's: the run's last test), as in ``--durations``.
* ``self s``: CPU seconds (user + system) of the pytest process itself, ``getrusage(RUSAGE_SELF)`` deltas
  around each test's setup, call and teardown (all of its threads, the sampler's included).
* ``kids s``: ``getrusage(RUSAGE_CHILDREN)`` deltas over the same span: the CPU of the child processes pytest
  *waited for* during the test. Caveat: the kernel adds a child's CPU to its parent's ``RUSAGE_CHILDREN`` only
  when the parent reaps it; a grandchild counts only if its own parent reaped it (then it is folded into that
  parent's count, which reaches us when we reap the parent). A child still running when the test ends counts
  for the test that reaps it; a process orphaned to init (its parent died first), a process killed and reaped
  by someone else, or one never waited for, counts nowhere. So this column misses much of a Gym stack: its
  servers and Ray's processes are killed as a session, and many are reaped by init.
* ``desc s``: CPU seconds of every *descendant* of pytest the sampler saw in ``/proc`` (its own utime + stime,
  whoever reaps it), each increase counted for the file running when it was seen. A lower bound: a process's
  CPU after its last sample (up to one interval), and processes that live less than an interval, are missed.
  Overlaps ``kids s`` (the same process can count in both), so the two are not to be added.
* ``stacks``: nemo-gym launchers (``ng_run`` processes) started, ``ray``: Ray heads (``gcs_server``
  processes: the shared head's and the clusters ng_run starts itself), each counted once by ``(pid, start
  time)``, for the file running when the sampler first saw it.

A background thread scans ``/proc`` every ``INTERVAL_S`` seconds. It reads the ``stat`` of processes it has not
seen before, and of pytest's descendants (for their CPU, and to catch an ``exec``: a changed ``comm``); a
process is a descendant when its parent is pytest or a descendant, or when its environment holds this run's
token (``TOKEN_VAR``, set in pytest's environment at start, so orphans that were reparented to init before the
sampler saw them still count). Processes of other users and other runs on the machine are left out. Where there
is no ``/proc`` the sampler is off and those columns read 0. Its own CPU is printed under the table.
"""

from __future__ import annotations

import os
import resource
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

INTERVAL_S = 0.5
TOKEN_VAR = "VERIFIERS_NEMO_SUITE_COSTS_RUN"
OUTSIDE = "(outside tests)"  # collection, start-up and whatever ran between tests
PROC = Path("/proc")
STACK = "stack"
RAY_HEAD = "ray_head"


# --- pure parts ---------------------------------------------------------------------------------------------


def file_of(nodeid: str) -> str:
    """The file part of a test's node id (``tests/unit/test_x.py::test_y[1]`` -> ``tests/unit/test_x.py``)."""
    return nodeid.split("::", 1)[0]


def process_kind(argv: Sequence[str]) -> str | None:
    """``STACK`` for nemo-gym's launcher ``ng_run`` or ``gym env start`` (0.7; the console script run directly, or
    by a Python interpreter: its cmdline is then ``python .../bin/ng_run ...``), ``RAY_HEAD`` for a Ray head's GCS
    server (``.../ray/core/src/ray/gcs/gcs_server ...``), else None. Only the program and, after an interpreter, the
    script are looked at: a supervisor whose JSON argument names ng_run is not a stack."""
    if not argv:
        return None
    program = os.path.basename(argv[0])
    if program == "gcs_server":
        return RAY_HEAD
    if program.startswith("python") and len(argv) > 1:  # an interpreter running the console script
        program, argv = os.path.basename(argv[1]), argv[1:]
    if program == "ng_run" or (program == "gym" and list(argv[1:3]) == ["env", "start"]):
        return STACK
    return None


def parse_cmdline(raw: bytes) -> list[str]:
    """``/proc/<pid>/cmdline`` (NUL-separated, NUL-terminated; a process forked warm pads it with NULs) as an
    argv list."""
    raw = raw.rstrip(b"\0")
    return [part.decode(errors="replace") for part in raw.split(b"\0")] if raw else []


@dataclass(frozen=True)
class Stat:
    """What the sampler needs of ``/proc/<pid>/stat``."""

    comm: str
    ppid: int
    cpu_ticks: int  # utime + stime, in clock ticks
    start: int  # start time after boot, in clock ticks: (pid, start) names one process


def parse_stat(text: str) -> Stat:
    """Parse ``/proc/<pid>/stat``; ``comm`` (field 2) is in parentheses and may hold spaces and ``)``."""
    head, _, rest = text.rpartition(")")
    comm = head.split("(", 1)[1]
    f = rest.split()  # f[0] is field 3 (state)
    return Stat(comm=comm, ppid=int(f[1]), cpu_ticks=int(f[11]) + int(f[12]), start=int(f[19]))


@dataclass
class FileCost:
    """One row of the table."""

    tests: int = 0
    wall: float = 0.0
    self_cpu: float = 0.0
    kids_cpu: float = 0.0
    desc_cpu: float = 0.0
    stacks: int = 0
    ray_heads: int = 0

    def add(self, other: FileCost) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class Ledger:
    """Costs per test file, written by pytest's hooks (main thread) and the sampler (its thread)."""

    def __init__(self) -> None:
        self.files: dict[str, FileCost] = {}
        self._lock = threading.Lock()

    def add(self, file: str, **amounts: float) -> None:
        with self._lock:
            row = self.files.setdefault(file, FileCost())
            for name, amount in amounts.items():
                setattr(row, name, getattr(row, name) + amount)

    def snapshot(self) -> dict[str, FileCost]:
        with self._lock:
            return {name: FileCost(**vars(row)) for name, row in self.files.items()}


def render(files: Mapping[str, FileCost]) -> list[str]:
    """The table: one line per file, by wall time (slowest first; ``OUTSIDE`` last), then the total."""
    total = FileCost()
    for row in files.values():
        total.add(row)
    order = sorted(files, key=lambda name: (name == OUTSIDE, -files[name].wall, name))
    width = max([len("file"), len("total"), *map(len, files)])
    heads = ("wall s", "self s", "kids s", "desc s")
    lines = [f"{'file':<{width}} {'tests':>5} " + " ".join(f"{h:>8}" for h in heads) + f" {'stacks':>6} {'ray':>4}"]

    def line(name: str, row: FileCost) -> str:
        return (
            f"{name:<{width}} {row.tests:>5} {row.wall:>8.1f} {row.self_cpu:>8.1f} {row.kids_cpu:>8.1f}"
            f" {row.desc_cpu:>8.1f} {row.stacks:>6} {row.ray_heads:>4}"
        )

    lines += [line(name, files[name]) for name in order]
    lines.append(line("total", total))
    return lines


# --- the /proc sampler --------------------------------------------------------------------------------------


@dataclass
class _Seen:
    start: int
    ours: bool
    comm: str = ""
    cpu_ticks: int = 0
    looks: int = 0


class ProcSampler:
    """Scans ``/proc`` every ``interval`` seconds on a daemon thread (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        current_file: Callable[[], str],
        token: str,
        interval: float = INTERVAL_S,
        kind_of: Callable[[Sequence[str]], str | None] = process_kind,
    ) -> None:
        self.ledger = ledger
        self.kind_of = kind_of
        self.current_file = current_file
        self.root = os.getpid()
        self.token = f"{TOKEN_VAR}={token}".encode()
        self.interval = interval
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self.seen: dict[int, _Seen] = {}
        self.counted: set[tuple[int, int]] = set()
        self.scans = 0
        self.cpu_s = 0.0  # the thread's own CPU
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="suite-costs-sampler", daemon=True)

    @staticmethod
    def available() -> bool:
        return (PROC / "self" / "stat").exists()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            last = self._stop.is_set()  # after stop(): one last look, for what the last test left
            begin = time.thread_time()
            try:
                self.scan()
            except Exception:  # measuring must never break the run
                pass
            self.cpu_s += time.thread_time() - begin
            if last:
                return
            self._stop.wait(self.interval)

    def scan(self) -> None:
        self.scans += 1
        file = self.current_file()
        live = {int(name) for name in os.listdir(PROC) if name.isdigit()}
        for pid in set(self.seen) - live:
            del self.seen[pid]
        fresh: dict[int, Stat] = {}
        for pid in live:
            known = self.seen.get(pid)
            if known is not None and not known.ours:
                continue  # not ours when it appeared (pids are not reused between two scans)
            stat = _read_stat(pid)
            if stat is None:
                continue
            if known is not None and known.start == stat.start:
                self._update(pid, known, stat, file)
            else:
                fresh[pid] = stat
        self._adopt(fresh, file)

    def _adopt(self, fresh: dict[int, Stat], file: str) -> None:
        """Decide which new processes are ours: ancestry first (parents before children, whatever the pids),
        then this run's token in the environment."""
        ours = {pid for pid, s in self.seen.items() if s.ours} | {self.root}
        pending = dict(fresh)
        tokens_read = False
        while pending:
            adopted = [pid for pid, stat in pending.items() if stat.ppid in ours]
            if not adopted and not tokens_read:
                adopted = [pid for pid in pending if self._has_token(pid)]
                tokens_read = True
            if not adopted:
                break
            for pid in adopted:
                ours.add(pid)
                del pending[pid]
        for pid, stat in fresh.items():
            mine = pid in ours and pid != self.root  # pytest's own CPU is RUSAGE_SELF's
            seen = _Seen(start=stat.start, ours=mine)
            self.seen[pid] = seen
            if mine:
                self._update(pid, seen, stat, file)

    def _update(self, pid: int, seen: _Seen, stat: Stat, file: str) -> None:
        amounts: dict[str, float] = {}
        if stat.cpu_ticks > seen.cpu_ticks:
            amounts["desc_cpu"] = (stat.cpu_ticks - seen.cpu_ticks) * self.tick_s
            seen.cpu_ticks = stat.cpu_ticks
        seen.looks += 1
        # new, or it exec'ed since (its comm changed), or once more in case the first look caught it between
        # fork and exec: (re)read what it runs
        if stat.comm != seen.comm or seen.looks == 2:
            seen.comm = stat.comm
            kind = self.kind_of(_read_cmdline(pid))
            key = (pid, stat.start)
            if kind is not None and key not in self.counted:
                self.counted.add(key)
                amounts["stacks" if kind == STACK else "ray_heads"] = 1
        if amounts:
            self.ledger.add(file, **amounts)

    def _has_token(self, pid: int) -> bool:
        try:
            return self.token in (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            return False


def _read_stat(pid: int) -> Stat | None:
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def _read_cmdline(pid: int) -> list[str]:
    try:
        return parse_cmdline((PROC / str(pid) / "cmdline").read_bytes())
    except OSError:
        return []


# --- the plugin ---------------------------------------------------------------------------------------------


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class SuiteCosts:
    """The plugin object: hooks that fill a ``Ledger``, and the table at the end.

    Under pytest-xdist each worker keeps its own ledger (its tests, its descendants) and hands it to the controller
    when it finishes (``workeroutput``); the controller, which runs no test, only adds them up and prints."""

    def __init__(self, role: str = "alone") -> None:
        self.role = role
        """``alone`` (no xdist), ``worker`` or ``controller``."""
        self.ledger = Ledger()
        self.current = OUTSIDE
        self.started = time.monotonic()
        self.self0, self.kids0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        token = secrets.token_hex(8)  # a worker's own: it counts its processes, not the other workers'
        os.environ[TOKEN_VAR] = token
        sampled = ProcSampler.available() and role != "controller"
        self.sampler = ProcSampler(self.ledger, lambda: self.current, token) if sampled else None
        if self.sampler is not None:
            self.sampler.start()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterable[None]:
        file = file_of(item.nodeid)
        self.current = file
        self_cpu, kids_cpu = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        try:
            return (yield)
        finally:
            self.ledger.add(
                file,
                tests=1,
                self_cpu=_cpu(resource.RUSAGE_SELF) - self_cpu,
                kids_cpu=_cpu(resource.RUSAGE_CHILDREN) - kids_cpu,
            )
            self.current = OUTSIDE

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.role != "controller":  # a worker's own ledger has it
            self.ledger.add(file_of(report.nodeid), wall=report.duration)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if self.role == "worker" and workeroutput is not None:
            if self.sampler is not None:
                self.sampler.stop()
            workeroutput["suite_costs"] = {name: vars(row) for name, row in self.ledger.snapshot().items()}

    def pytest_testnodedown(self, node: object, error: object) -> None:
        """A worker finished (xdist): its ledger joins the controller's."""
        output = getattr(node, "workeroutput", {})
        for name, row in output.get("suite_costs", {}).items():
            self.ledger.add(name, **row)

    @pytest.hookimpl(trylast=True)  # after --durations: the last thing before the result line
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if terminalreporter.config.option.collectonly:
            return
        files = self.ledger.snapshot()
        tested = FileCost()
        for row in files.values():
            tested.add(row)
        outside = files.setdefault(OUTSIDE, FileCost())
        elapsed = time.monotonic() - self.started
        if self.role == "alone":  # under xdist the files' walls overlap: their sum is no part of the elapsed time
            outside.wall += max(0.0, elapsed - tested.wall)
        outside.self_cpu += max(0.0, _cpu(resource.RUSAGE_SELF) - self.self0 - tested.self_cpu)
        outside.kids_cpu += max(0.0, _cpu(resource.RUSAGE_CHILDREN) - self.kids0 - tested.kids_cpu)
        tr = terminalreporter
        tr.write_sep("=", "suite costs per test file (slowest first)")
        for line in render(files):
            tr.write_line(line)
        if self.role == "controller":
            tr.write_line(f"xdist: each file's figures are its worker's; {elapsed:.1f}s elapsed in all")
        elif self.sampler is None:
            tr.write_line("no /proc here: desc s, stacks and ray not measured")
        else:
            s = self.sampler
            tr.write_line(
                f"sampler: {s.scans} scans of /proc every {s.interval:g}s, {s.cpu_s:.2f}s CPU (in self s)"
                f"; {len(s.counted)} stacks + Ray heads"
            )
        tr.write_line(
            "self: pytest's CPU; kids: children it waited for (RUSAGE_CHILDREN); desc: all descendants, sampled;"
            " stacks: ng_run started; ray: Ray heads (gcs_server) started. See tests/suite_costs.py."
        )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: it measures, the controller prints the table
        role = "worker"
    elif getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") != "no":
        role = "controller"
    else:
        role = "alone"
    config.pluginmanager.register(SuiteCosts(role), "suite_costs_plugin")

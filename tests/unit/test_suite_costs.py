"""The suite-costs plugin's pure parts: which processes are stacks and Ray heads, /proc parsing, the per-file
ledger and its table; and the sampler on a real child process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.suite_costs import (
    OUTSIDE,
    RAY_HEAD,
    STACK,
    FileCost,
    Ledger,
    ProcSampler,
    Stat,
    file_of,
    parse_cmdline,
    parse_stat,
    process_kind,
    render,
)

NG_RUN = "/root/.cache/verifiers-nemo/gym/0.4/venv/bin/ng_run"
GCS = "/root/.cache/verifiers-nemo/gym/0.4/venv/lib/python3.12/site-packages/ray/core/src/ray/gcs/gcs_server"


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        ([NG_RUN, "+config_paths=[a.yaml]"], STACK),  # the console script exec'ed through its shebang
        (["/venv/bin/python3", NG_RUN, "+config_paths=[a.yaml]"], STACK),  # its interpreter named
        (["python", "ng_run"], STACK),
        (["/venv/bin/python3.13", "/venv/bin/gym", "env", "start", "+config_paths=[a.yaml]"], STACK),  # 0.7
        (["/venv/bin/gym", "env", "start"], STACK),
        (["/venv/bin/gym", "env", "list"], None),
        ([GCS, "--gcs_server_port=6379", "--log_dir=/tmp/ray/session/logs"], RAY_HEAD),
        # what is not one: the supervisor whose JSON spec names ng_run, Ray's other processes, a grep
        (["/venv/bin/python", "/x/_gym_side/supervisor.py", f'{{"argv": ["{NG_RUN}"]}}'], None),
        (["/venv/bin/python", "/venv/bin/ray", "start", "--head", "--block"], None),
        (["/venv/lib/ray/core/src/ray/raylet/raylet", "--gcs-address=127.0.0.1:1"], None),
        (["grep", "ng_run"], None),
        (["/venv/bin/ng_run_helper"], None),
        ([], None),
    ],
)
def test_stacks_and_ray_heads_are_told_by_their_program(argv: list[str], kind: str | None) -> None:
    assert process_kind(argv) == kind


def test_cmdline_is_split_on_nuls() -> None:
    assert parse_cmdline(b"/venv/bin/python\0/venv/bin/ng_run\0+a=[x y]\0") == [
        "/venv/bin/python",
        "/venv/bin/ng_run",
        "+a=[x y]",
    ]
    assert parse_cmdline(b"") == []  # a zombie or a kernel thread


def test_stat_is_parsed_past_a_comm_with_spaces_and_parentheses() -> None:
    fields = ["S", "41", *["0"] * 9, "120", "35", *["0"] * 6, "987654", "0"]
    stat = parse_stat("1234 (we ird) (x) " + " ".join(fields) + "\n")
    assert (stat.comm, stat.ppid, stat.cpu_ticks, stat.start) == ("we ird) (x", 41, 155, 987654)
    own = parse_stat(Path("/proc/self/stat").read_text()) if os.path.exists("/proc/self/stat") else None
    if own is not None:
        assert own.ppid == os.getppid() and own.start > 0


def test_node_ids_are_counted_for_their_file() -> None:
    assert file_of("tests/unit/test_x.py::test_y[a::b]") == "tests/unit/test_x.py"
    assert file_of("tests/e2e/test_z.py::TestC::test_d") == "tests/e2e/test_z.py"
    assert file_of("tests/unit/test_x.py") == "tests/unit/test_x.py"


def test_the_ledger_sums_per_file_and_the_table_puts_the_slowest_first_and_the_total_last() -> None:
    ledger = Ledger()
    for phase in (0.5, 2.0, 0.5):  # setup (a fixture's start counts here), call, teardown
        ledger.add("tests/e2e/test_b.py", wall=phase)
    ledger.add("tests/e2e/test_b.py", tests=1, self_cpu=1.0, kids_cpu=0.5)
    ledger.add("tests/e2e/test_b.py", stacks=1)
    ledger.add("tests/e2e/test_b.py", ray_heads=1, desc_cpu=4.0)
    ledger.add("tests/unit/test_a.py", tests=2, wall=0.25, self_cpu=0.25)
    ledger.add("tests/e2e/test_c.py", tests=1, wall=9.0, stacks=2, ray_heads=1)
    ledger.add(OUTSIDE, wall=30.0, self_cpu=2.0)  # however long: not among the files
    files = ledger.snapshot()
    assert files["tests/e2e/test_b.py"] == FileCost(
        tests=1, wall=3.0, self_cpu=1.0, kids_cpu=0.5, desc_cpu=4.0, stacks=1, ray_heads=1
    )
    ledger.add("tests/e2e/test_b.py", wall=1.0)
    assert files["tests/e2e/test_b.py"].wall == 3.0  # a snapshot is a copy

    lines = render(files)
    assert lines[0].split() == ["file", "tests", "wall", "s", "self", "s", "kids", "s", "desc", "s", "stacks", "ray"]
    assert [line.split()[0] for line in lines[1:]] == [
        "tests/e2e/test_c.py",
        "tests/e2e/test_b.py",
        "tests/unit/test_a.py",
        "(outside",
        "total",
    ]
    assert lines[2].split()[1:] == ["1", "3.0", "1.0", "0.5", "4.0", "1", "1"]
    assert lines[-1].split()[1:] == ["4", "42.2", "3.2", "0.5", "4.0", "3", "2"]
    assert len({len(line) for line in lines}) == 1  # columns line up


def test_the_sampler_adopts_descendants_and_token_holders_and_counts_each_process_once(monkeypatch) -> None:
    """Ancestry (parents before children, whatever their pids), else this run's token in the environment;
    a process is counted once by (pid, start time), again only when it exec's a stack or a head."""
    import tests.suite_costs as suite_costs

    monkeypatch.setattr(suite_costs, "_read_cmdline", lambda pid: [programs[pid]])
    ledger = Ledger()
    sampler = ProcSampler(ledger, lambda: "f.py", token="t")
    sampler.root = 100
    sampler._has_token = lambda pid: pid == 205  # an orphan of ours (reparented to init), by its environment

    def stat(comm: str, ppid: int, ticks: int = 10, start: int = 1) -> Stat:
        return Stat(comm=comm, ppid=ppid, cpu_ticks=ticks, start=start)

    programs = {99: "x", 100: "pytest", 101: "python", 102: "ng_run", 205: "ng_run", 206: "gcs_server"}
    programs |= {300: "ng_run", 301: "gcs_server"}
    fresh = {
        99: stat("x", 1),
        100: stat("pytest", 1),  # pytest itself: its CPU is RUSAGE_SELF's
        102: stat("ng_run", 101),  # seen before its parent in pid order
        101: stat("python", 100),
        206: stat("gcs_server", 205),
        205: stat("ng_run", 1),
        300: stat("ng_run", 1),  # another run's: neither ours by ancestry nor by token
        301: stat("gcs_server", 300),
    }
    sampler._adopt(fresh, "f.py")
    assert {pid for pid, seen in sampler.seen.items() if seen.ours} == {101, 102, 205, 206}
    assert ledger.snapshot()["f.py"] == FileCost(desc_cpu=40 * sampler.tick_s, stacks=2, ray_heads=1)

    for pid in (101, 102, 205, 206):  # later scans: only the CPU they used since counts
        sampler._update(pid, sampler.seen[pid], stat(programs[pid], 0, ticks=15), "g.py")
    assert ledger.snapshot()["g.py"] == FileCost(desc_cpu=20 * sampler.tick_s)
    programs[101] = "/venv/bin/ng_run"  # 101 exec'ed a stack
    sampler._update(101, sampler.seen[101], stat("ng_run", 100, ticks=15), "h.py")
    sampler._update(101, sampler.seen[101], stat("ng_run", 100, ticks=15), "h.py")
    assert ledger.snapshot()["h.py"] == FileCost(stacks=1)


@pytest.mark.skipif(not ProcSampler.available(), reason="no /proc")
def test_the_sampler_counts_a_stack_started_by_a_grandchild_whose_parent_exited(tmp_path) -> None:
    """A (fake) ``ng_run`` run by a child that exits at once: orphaned to init, it still counts, through
    this run's token in its environment if the sampler did not see it while its parent lived. (Named
    ``fake_ng_run``, which the suite's own sampler does not count as a stack.)"""
    ng_run = tmp_path / "fake_ng_run"
    ng_run.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(2)\n")  # as Gym's: python .../ng_run
    ng_run.chmod(0o755)
    ledger = Ledger()
    kind_of = lambda argv: process_kind([name.replace("fake_ng_run", "ng_run") for name in argv])  # noqa: E731
    sampler = ProcSampler(ledger, lambda: "tests/e2e/test_x.py", token="t0k3n", interval=0.05, kind_of=kind_of)
    sampler.start()
    try:
        env = {**os.environ, "VERIFIERS_NEMO_SUITE_COSTS_RUN": "t0k3n"}
        orphaner = f"import subprocess; subprocess.Popen([{str(ng_run)!r}], start_new_session=True)"
        subprocess.run([sys.executable, "-c", orphaner], env=env, check=True)
        deadline = time.monotonic() + 1.5
        while not ledger.snapshot().get("tests/e2e/test_x.py", FileCost()).stacks and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
    assert ledger.snapshot()["tests/e2e/test_x.py"].stacks == 1
    assert sampler.scans > 2 and sampler.cpu_s < 1.5

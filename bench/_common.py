"""What every benchmark shares: CPU time and memory read from /proc, percentiles, and the ``--json``
file of figures that ``run_all.py`` reads (each benchmark also prints its own tables)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def cpu_seconds(*pids: int) -> float:
    """User + system CPU seconds of the processes ``pids`` (0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            continue
    return total


def rss_self() -> int:
    """Resident memory of this process, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH as JSON")


def write_json(path: Path | None, figures: Any) -> None:
    """Write ``figures`` to ``path`` (when given) as JSON."""
    if path is not None:
        path.write_text(json.dumps(figures, indent=2) + "\n")


def session_pids(*sids: int | None) -> list[int]:
    """The live (not zombie) processes of these process sessions (``/proc/PID/stat``); None and 0 are ignored."""
    wanted = {sid for sid in sids if sid}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[3]) in wanted and fields[0] != b"Z":
            pids.append(int(entry))
    return pids


def gym_runtimes(releases: str) -> dict[str, str | None]:
    """The Gym runtimes a benchmark compares, of those named (``"0.4,0.7"``): 0.4 is this interpreter's venv
    (``None``), 0.7 the test-only ``.venv-gym07`` when it was built (3.13.0 told the 3.13.14 floor)."""
    runtimes: dict[str, str | None] = {"0.4": None}
    gym07 = Path(__file__).resolve().parents[1] / ".venv-gym07" / "bin" / "python"
    if gym07.exists():
        runtimes["0.7"] = str(gym07)
    return {release: python for release, python in runtimes.items() if release in releases.split(",")}

"""Offline clusters (issue 60): a gathered folder's size, the time to gather it, the time to a first start offline,
and the folder of wheels side by side with the other way to carry an install, copying the connected machine's cache
(its runtime and derived venvs).

Connected side: ``verifiers-nemo prepare ENVS --gather DIR`` from an interpreter without nemo-gym (``--cli``, default
the verifiers venv's), so that the managed Gym runtime (nemo-gym 0.4.0 on Python 3.12) is built and gathered too,
with a fresh cache. Offline side: a network namespace with loopback only (``unshare -n``: root), a fresh cache and
a fresh uv cache:

* wheels: ``prepare ENVS --check`` (builds the runtime from the folder), then ``eval ENV -n 3`` twice (the first
  installs ENV's packages from the folder);
* copied cache: the connected cache moved to another path (a cluster whose home differs; the original gone, as it is
  on the cluster), then ``eval ENV -n 3`` with that cache.

Sizes are on disk (``du``) and what a transfer carries (``tar | gzip -1`` bytes). Run as root:

    PYTHONPATH=$PWD .venv/bin/python bench/bench_offline.py
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(argv: list[str], env: dict[str, str], cwd: Path, offline: bool = False) -> tuple[float, int, str]:
    if offline:
        argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    return time.monotonic() - started, done.returncode, done.stdout + done.stderr


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _gzipped(path: Path) -> int:
    tar = subprocess.Popen(["tar", "-C", str(path.parent), "-cf", "-", path.name], stdout=subprocess.PIPE)
    gz = subprocess.run(["gzip", "-1"], stdin=tar.stdout, capture_output=True, check=True)
    tar.wait()
    return len(gz.stdout)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", default=str(ROOT / ".venv-vf" / "bin" / "verifiers-nemo"))
    parser.add_argument("--envs", default="mcqa,simpleqa", help="gathered (comma-separated); the first is evaluated")
    args = parser.parse_args()
    envs = args.envs.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-offline-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERIFIERS_NEMO_")}
    connected = base | {"VERIFIERS_NEMO_CACHE_DIR": str(work / "connected-cache")}
    folder = work / "offline-folder"
    rows: list[tuple[str, str]] = []
    try:
        seconds, code, out = _timed([args.cli, "prepare", *envs, "--gather", str(folder)], connected, work)
        assert code == 0, out[-3000:]
        said = re.search(r"gathered (\d+) packages .*: ([\d.]+) MiB, ([\d.]+)s\.", out)
        assert said, out[-2000:]
        wheels = f"{said.group(1)} wheels, {said.group(3)} s of it building the folder"
        rows.append(("gather (builds the runtime, installs, wheels)", f"{seconds:.1f} s ({wheels})"))
        runtime_venv = next((work / "connected-cache" / "gym-runtime").glob("nemo-gym-*"))
        cache = work / "connected-cache"
        folder_bytes, cache_bytes = _du(folder), _du(cache)
        folder_gz, cache_gz = _gzipped(folder), _gzipped(cache)
        rows.append(("folder of wheels on disk / gzipped", f"{_mib(folder_bytes)} / {_mib(folder_gz)}"))
        rows.append(("connected cache on disk / gzipped", f"{_mib(cache_bytes)} / {_mib(cache_gz)}"))
        rows.append(("  of which the runtime venv", _mib(_du(runtime_venv))))
        ratio = f"{cache_bytes / folder_bytes:.2f}x, {cache_gz / folder_gz:.2f}x"
        rows.append(("cache / folder (on disk, gzipped)", ratio))

        cluster = base | {"VERIFIERS_NEMO_CACHE_DIR": str(work / "cluster-cache"), "UV_CACHE_DIR": str(work / "uv")}
        cluster |= {"VERIFIERS_NEMO_OFFLINE_DIR": str(folder)}
        check_s, code, out = _timed([args.cli, "prepare", *envs, "--check"], cluster, work, offline=True)
        assert code == 0, out[-3000:]
        first_s, code, out = _timed([args.cli, "eval", envs[0], "-n", "3"], cluster, work, offline=True)
        assert code == 0 and "(all reproduced)" in out, out[-3000:]
        again_s, code, out = _timed([args.cli, "eval", envs[0], "-n", "3"], cluster, work, offline=True)
        assert code == 0, out[-3000:]
        rows.append(("offline: check (builds the runtime from wheels)", f"{check_s:.1f} s"))
        rows.append((f"offline: first eval {envs[0]} -n 3 (installs its packages)", f"{first_s:.1f} s"))
        rows.append(("offline: to the first result, from nothing", f"{check_s + first_s:.1f} s"))
        rows.append((f"offline: second eval {envs[0]} -n 3", f"{again_s:.1f} s"))

        moved = work / "elsewhere" / "cache"
        moved.parent.mkdir()
        started = time.monotonic()
        shutil.move(str(cache), str(moved))
        move_s = time.monotonic() - started
        copied = base | {"VERIFIERS_NEMO_CACHE_DIR": str(moved), "UV_CACHE_DIR": str(work / "uv2")}
        seconds, code, out = _timed([args.cli, "eval", envs[0], "-n", "3"], copied, work, offline=True)
        said = next((line for line in out.splitlines() if "error:" in line), out.strip()[-150:])[:160]
        ok = "reproduced" if code == 0 and "(all reproduced)" in out else f"failed (exit {code}): {said}"
        rows.append(("copied cache at another path: eval", f"{seconds:.1f} s, {ok} (move {move_s:.1f} s)"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    width = max(len(name) for name, _ in rows)
    print(f"offline folder vs copied cache ({args.cli}; envs {', '.join(envs)})")
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

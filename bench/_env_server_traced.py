"""``tests/e2e/env_server_driver.py`` with Python's allocations traced (``bench_env_server_memory.py``).

Runs the driver as it is (``serve`` or ``client``), after starting ``tracemalloc`` when ``$BENCH_TRACE_DIR`` is
set; a thread then answers each file ``<dir>/<pid>.want-<name>`` with ``<dir>/<pid>.<name>.json``: the bytes
traced now, by source file (where each block still held was allocated), after a full garbage collection."""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

DRIVER_DIR = Path(__file__).resolve().parents[1] / "tests" / "e2e"


def _answer_requests(directory: Path) -> None:
    prefix = f"{os.getpid()}.want-"
    while True:
        for want in directory.glob(f"{prefix}*"):
            name = want.name.removeprefix(prefix)
            gc.collect()
            snapshot = tracemalloc.take_snapshot()
            by_file: dict[str, int] = {}
            for stat in snapshot.statistics("filename"):
                by_file[stat.traceback[0].filename] = stat.size
            partial = directory / f"{os.getpid()}.{name}.tmp"
            partial.write_text(json.dumps(by_file))
            partial.rename(directory / f"{os.getpid()}.{name}.json")
            want.unlink()
        time.sleep(0.2)


if __name__ == "__main__":
    trace_dir = os.environ.get("BENCH_TRACE_DIR")
    if trace_dir:
        tracemalloc.start(1)
        threading.Thread(target=_answer_requests, args=(Path(trace_dir),), daemon=True).start()
    sys.path.insert(0, str(DRIVER_DIR))
    import env_server_driver

    env_server_driver.main()

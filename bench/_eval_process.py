"""``verifiers-nemo ARGS`` in this process, as the console script runs it; at exit, the process's peak RSS
(``VmHWM``) and CPU seconds are written as JSON to ``$BENCH_EVAL_STATS`` (``bench_eval_memory.py`` reads them).

The interpreter that runs this file decides which ``verifiers_nemo`` runs (this tree's, or another checkout's)."""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys


def _write_stats() -> None:
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    figures = {
        "vm_hwm_kb": int(fields["VmHWM"].split()[0]),
        "vm_rss_kb": int(fields["VmRSS"].split()[0]),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "module": os.path.dirname(sys.modules["verifiers_nemo"].__file__ or ""),
    }
    with open(os.environ["BENCH_EVAL_STATS"], "w") as out:
        json.dump(figures, out)


if __name__ == "__main__":
    atexit.register(_write_stats)
    from verifiers_nemo._cli.main import main

    sys.exit(main(sys.argv[1:]))

"""Benchmark: NeMoGymTaskset load time and peak memory on a generated 1,000,000-row JSONL.

    .venv/bin/python bench/bench_taskset.py [--rows N] [--keep DIR]

Writes realistic Gym rows (a system prompt, a user turn, two function tools, an agent_ref and extra
fields for the resources server, about 1 KB each) to a temporary directory, then loads them in one
fresh subprocess per case so that each peak-memory figure stands alone: the whole file, the first
100 rows (``limit=100``: reading stops there), and a shuffled sample of 100 (``shuffle=True, limit=100``:
reservoir sampling reads the whole file but holds 100 rows). The file is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import add_json_flag, rss_self, write_json

CASES: dict[str, dict[str, object]] = {
    "full load": {},
    "limit=100": {"limit": 100},
    "shuffle, limit=100": {"shuffle": True, "seed": 0, "limit": 100},
}

_WORDS = (
    "synonym", "extract", "value", "term", "query", "agent", "tool", "list", "order", "relevant",
    "available", "provided", "output", "warm", "cold", "open", "closed", "early", "late", "bright",
)  # fmt: skip

TOOLS = [
    {
        "type": "function",
        "name": "get_synonym_value",
        "description": "Get the value for a synonym.",
        "parameters": {
            "type": "object",
            "properties": {"synonym": {"type": "string", "description": "The synonym to get the value for."}},
            "required": ["synonym"],
            "additionalProperties": False,
        },
        "strict": True,
    },
    {
        "type": "function",
        "name": "extract_synonym_values",
        "description": "Extract the synonym values you retrieved for the term that is relevant to the query.",
        "parameters": {
            "type": "object",
            "properties": {"synonym_values": {"type": "array", "items": {"type": "integer"}}},
            "required": ["synonym_values"],
            "additionalProperties": False,
        },
        "strict": True,
    },
]


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Write ``rows`` Gym task rows of about 1 KB each."""
    rng = random.Random(seed)
    system = "# Instructions\nYou are an extraction agent. " + " ".join(rng.choice(_WORDS) for _ in range(40))
    tools = json.dumps(TOOLS)
    with path.open("w", encoding="utf-8") as handle:
        for index in range(rows):
            query = " ".join(rng.choice(_WORDS) for _ in range(12))
            row = {
                "id": index,
                "responses_create_params": {
                    "input": [
                        {"role": "developer", "content": system},
                        {"role": "user", "content": f"Query {index}: {query}"},
                    ],
                    "tools": "__TOOLS__",
                },
                "agent_ref": {"type": "responses_api_agents", "name": "example_multi_step_simple_agent"},
                "expected_synonyms": [rng.choice(_WORDS) for _ in range(3)],
                "expected_synonym_values": [rng.randrange(1000) for _ in range(3)],
                "minefield_label": rng.choice(_WORDS),
            }
            handle.write(json.dumps(row).replace('"__TOOLS__"', tools) + "\n")


def worker(path: str, case: str) -> None:
    """Load one case in this (fresh) process and print its figures as JSON."""
    from verifiers_nemo import NeMoGymTaskset

    baseline_kb = rss_self() // 1024
    start = time.perf_counter()
    tasks = NeMoGymTaskset(jsonl_path=path, **CASES[case])  # type: ignore[arg-type]
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    first = tasks[0]  # building a task parses its row on demand
    assert first.prompt and first.tools
    print(json.dumps({"tasks": len(tasks), "seconds": seconds, "peak_kb": peak_kb, "baseline_kb": baseline_kb}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="write the JSONL here and keep it")
    add_json_flag(parser)
    parser.add_argument("--worker", nargs=2, metavar=("PATH", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return

    directory = args.keep or Path(tempfile.mkdtemp(prefix="bench_taskset_"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tasks.jsonl"
    try:
        start = time.perf_counter()
        generate(path, args.rows)
        generated = time.perf_counter() - start
        size_mb = path.stat().st_size / 1e6
        print(
            f"{args.rows:,} rows, {size_mb:,.0f} MB ({size_mb * 1e6 / args.rows:,.0f} B/row), "
            f"generated in {generated:.1f} s; one fresh subprocess per case\n"
        )
        print(f"{'case':<20} {'tasks':>9} {'load s':>9} {'peak RSS MB':>12} {'added MB':>9}")
        out: dict[str, Any] = {"rows": f"{args.rows:,}", "mb": f"{size_mb:,.0f}", "cases": {}}
        for case in CASES:
            result = subprocess.run(
                [sys.executable, __file__, "--worker", str(path), case],
                check=True,
                capture_output=True,
                text=True,
            )
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            peak_mb = figures["peak_kb"] / 1024
            added_mb = (figures["peak_kb"] - figures["baseline_kb"]) / 1024
            tasks, seconds = figures["tasks"], figures["seconds"]
            print(f"{case:<20} {tasks:>9,} {seconds:>9.3f} {peak_mb:>12.1f} {added_mb:>9.1f}")
            out["cases"][case] = {
                "tasks": tasks,
                "secs": f"{seconds:.3f}",
                "peak": f"{peak_mb:.1f}",
                "added": f"{added_mb:.1f}",
            }
        write_json(args.json, out)
    finally:
        if args.keep is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()

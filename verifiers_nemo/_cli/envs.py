"""``verifiers-nemo envs``: the packaged Gym environments and what running each needs, as a table
or JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from .._exceptions import VerifiersNemoError
from .console import EXIT_FAILED, EXIT_OK, PROG, fail


def cmd_envs(args: argparse.Namespace) -> int:
    from .._gym import list_environments

    try:
        environments = list_environments()
    except VerifiersNemoError as exc:
        return fail(str(exc), EXIT_FAILED)
    total = len(environments)
    runnable_count = sum(e.runs_offline_with_nemo_gym_only for e in environments)
    if args.filter:
        environments = [e for e in environments if args.filter.lower() in e.name.lower()]
    if args.runnable:
        environments = [e for e in environments if e.runs_offline_with_nemo_gym_only]
    if args.recorded:
        environments = [e for e in environments if e.has_example_rollouts]
    rows = [_env_row(e) for e in environments]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    columns = [  # title, key, widest it may get
        ("NAME", "name", 48),
        ("AGENT", "agent", 24),
        ("DATASETS", "datasets", 36),
        ("EXTRA DEPS", "extra_deps", 32),
        ("NEEDS", "needs", 15),
        ("RECORDED", "recorded", 8),
    ]
    table = [[_cell(row[key]) + _dagger(row, key) for _, key, _ in columns] for row in rows]
    widths = [min(cap, max([len(title), *(len(r[i]) for r in table)])) for i, (title, _, cap) in enumerate(columns)]
    print("  ".join(title.ljust(w) for (title, _, _), w in zip(columns, widths, strict=True)).rstrip())
    for r in table:
        print("  ".join(_clip(cell, w).ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print(
        f"\n{len(rows)} shown of {total} environments ({PROG} envs --json for all details); "
        f"{runnable_count} need nothing beyond nemo-gym (--runnable).\n"
        "* not shipped: nemo-gym downloads it. NEEDS: judge = scores with a model server; "
        "external = a service, credential or download.\n"
        "† its recordings cannot reproduce their rewards (why: --json, replay_not_reproducible).\n"
        f"Run one: {PROG} eval NAME (replays its recorded rollouts; add -b URL -m MODEL for a model)"
    )
    return EXIT_OK


def _env_row(env: Any) -> dict[str, Any]:
    from .._upstreams import unreproducible_reason

    needs = [n for n, flag in (("judge", env.needs_judge), ("external", env.needs_external)) if flag]
    agent = env.default_agent
    return {
        "name": env.name,
        "agent": agent.type if agent else None,
        "datasets": _dataset_names(env.datasets),
        "extra_deps": list(env.requirements),
        "needs": needs,
        "recorded": env.has_example_rollouts,
        "replay_not_reproducible": unreproducible_reason(env.name),
        "runnable": env.runs_offline_with_nemo_gym_only,
        "judge_models": list(env.judge_models),
        "external_reasons": list(env.external_reasons),
    }


def _dagger(row: dict[str, Any], key: str) -> str:
    return "†" if key == "recorded" and row["recorded"] and row["replay_not_reproducible"] else ""


def _dataset_names(datasets: Sequence[Any]) -> list[str]:
    """Dataset names, ``*`` marking those not shipped with nemo-gym (it downloads them)."""
    shipped: dict[str, bool] = {}
    for dataset in datasets:
        shipped[dataset.name] = shipped.get(dataset.name, False) or dataset.exists
    return [name if present else f"{name}*" for name, present in shipped.items()]


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in dict.fromkeys(value)) or "-"
    return "-" if value is None else str(value)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"

"""``verifiers-nemo envs``: the packaged Gym environments, what running each needs (a judge, packages
beyond nemo-gym and whether they are installed, environment variables, external services) and whether
it is ready to run here, as a table or JSON."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._exceptions import VerifiersNemoError
from .console import EXIT_FAILED, EXIT_OK, PROG, fail


def cmd_envs(args: argparse.Namespace) -> int:
    from .._gym import get_environment, gym_root, is_path_reference, list_environments
    from .._gym.releases import installed_version

    try:
        root = gym_root()
        environments = list_environments(root)
        version = installed_version(root)
        total = len(environments)
        runnable_count = sum(e.runs_offline_with_nemo_gym_only for e in environments)
        kinds = Counter(e.kind for e in environments)
        if args.kind:
            environments = [e for e in environments if e.kind == args.kind.replace("-", " ")]
        if args.filter and is_path_reference(args.filter):  # a folder of yours: that one, read as eval reads it
            environments = [get_environment(args.filter, root)]
        elif args.filter:
            matching = [e for e in environments if args.filter.lower() in e.ref.lower()]
            environments = matching or _named(args.filter, root, args.kind)
        if args.runnable:
            environments = [e for e in environments if e.runs_offline_with_nemo_gym_only]
        if args.recorded:
            environments = [e for e in environments if e.has_example_rollouts]
        states = _requirement_states(environments)
    except VerifiersNemoError as exc:
        return fail(str(exc), EXIT_FAILED)
    rows = [_env_row(e, states, version) for e in environments]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    columns = [  # title, key, widest it may get
        ("NAME", "name", 40),
        ("KIND", "kind", 16),
        ("AGENT", "agent", 22),
        ("DATASETS", "datasets", 28),
        ("EXTRA DEPS", "extra_deps", 28),
        ("NEEDS", "needs_cell", 40),
        ("VARIABLES", "variable_names", 28),
        ("READY", "ready_cell", 24),
        ("NETWORK", "network_cell", 28),
        ("RECORDED", "recorded", 8),
        ("FROM", "source", 60),
    ]
    table = [[_cell(row[key]) + _dagger(row, key) for _, key, _ in columns] for row in rows]
    widths = [min(cap, max([len(title), *(len(r[i]) for r in table)])) for i, (title, _, cap) in enumerate(columns)]
    print("  ".join(title.ljust(w) for (title, _, _), w in zip(columns, widths, strict=True)).rstrip())
    for r in table:
        cells = [_clip(cell, w, tail=key == "source") for cell, w, (_, key, _) in zip(r, widths, columns, strict=True)]
        print("  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip())
    ready = sum(row["ready"] for row in rows)
    print(
        f"\nnemo-gym {version or '(version unknown)'} · "
        f"{len(rows)} shown of {total} ({_kind_counts(kinds)}), {ready} of them ready here ({PROG} envs --json for all "
        f"details); {runnable_count} need nothing beyond nemo-gym (--runnable).\n"
        "* not shipped: nemo-gym downloads it. NEEDS: judge: NAME = scores with that model server (--judge "
        "NAME=URL,MODEL; policy_model: the policy grades itself); external = a service, credential or download.\n"
        "EXTRA DEPS are installed for you on the first start (cached after); READY says 'installs' until then. "
        "VARIABLES: ! = required and not set. NETWORK: what a run reaches the network for (packages, git, judge, "
        "external, data; download? = a download call in its servers' code; details: --json, network).\n"
        "FROM: packaged, or the folder of an environment of yours "
        "(--gym-root DIR, VERIFIERS_NEMO_GYM_ROOT, ./resources_servers/).\n"
        "† its recordings cannot reproduce their rewards (why: --json, replay_not_reproducible).\n" + _run_one(rows)
    )
    return EXIT_OK


def _run_one(rows: Sequence[dict[str, Any]]) -> str:
    """How to run one of ``rows``: a replay only where they ship recordings to replay."""
    recorded = sum(1 for row in rows if row["recorded"])
    model = "-b URL -m MODEL for a model, --policy-script FILE.py for a function of yours"
    if recorded == len(rows):
        return f"Run one: {PROG} eval NAME (replays its recorded rollouts; add {model})"
    if recorded == 0:
        return f"Run one: {PROG} eval NAME with {model} (none shown ships recorded rollouts to replay)"
    return f"Run one: {PROG} eval NAME (replays its recorded rollouts where RECORDED says yes; else add {model})"


def _kind_counts(kinds: Counter[str]) -> str:
    """``48 environments, 184 benchmarks, 145 resources servers`` (the kinds a release has)."""
    order = ("environment", "benchmark", "resources server")
    return ", ".join(f"{kinds[k]} {k}{'s' if kinds[k] != 1 else ''}" for k in order if kinds[k])


def _requirement_states(environments: Sequence[Any]) -> dict[Path, str]:
    """The state of every server folder's requirements (see ``requirement_states``); one runtime probe."""
    if not any(e.requirements for e in environments):
        return {}
    from .._gym import find_gym_runtime, requirements_beyond_nemo_gym
    from .._stack.requirements import requirement_states

    wanted = {}
    for env in environments:
        for directory in _server_dirs(env):
            wanted[directory] = requirements_beyond_nemo_gym(directory)[0]
    return requirement_states(wanted, find_gym_runtime())


def _server_dirs(env: Any) -> list[Path]:
    from .._gym import RESPONSES_API_MODELS

    config = env.default_config
    if config is None:
        return [env.directory]
    tree = env.search
    folders = (tree.server_dir(s.kind, s.type) for s in config.servers if s.kind != RESPONSES_API_MODELS)
    return list(dict.fromkeys(folders))


def _env_row(env: Any, states: dict[Path, str], gym_version: str | None = None) -> dict[str, Any]:
    from .._gym import POLICY_MODEL
    from .._gym.config import load_yaml
    from .._gym.env_vars import config_variables
    from .._offline.network_use import network_cell, network_uses
    from .._replay import unreproducible_reason
    from .._stack.requirements import CACHED, INSTALLED, TO_INSTALL

    needs = [n for n, flag in (("judge", env.needs_judge), ("external", env.needs_external)) if flag]
    agent = env.default_agent
    server_states = {states[d] for d in _server_dirs(env) if d in states}
    requirements_state = next((s for s in (TO_INSTALL, CACHED, INSTALLED) if s in server_states), None)
    variables = config_variables(load_yaml(env.default_config.path)) if env.default_config else ()
    blockers = []
    if env.broken:
        blockers.append("cannot start (see --json)")
    if agent is None:
        blockers.append("no agent")
    unprepared = env.benchmark is not None and not _benchmark_rows_present(env)
    if unprepared:
        blockers.append(f"its data ({PROG} prepare {env.ref})")
    judges = [j for j in env.judge_models if j != POLICY_MODEL]
    if judges:
        blockers.append("a judge endpoint")
    if requirements_state == TO_INSTALL and not _has_uv():
        blockers.append("uv (pip install uv)")
    unset = [v.name for v in variables if v.required and not v.is_set]
    blockers += [f"${name}" for name in unset]
    set_names = [v.name for v in variables if v.is_set]
    uncovered = [r for r in env.external_reasons if not any(name in r for name in set_names)]
    if uncovered and not unset:
        blockers.append("external")
    uses = network_uses(
        to_install=list(env.requirements) if requirements_state == TO_INSTALL else [],
        server_dirs=_server_dirs(env),
        judges=judges,
        external_reasons=env.external_reasons,
        unprepared_data=(env.benchmark.prepare_script or "its prepare script") if unprepared else None,
    )
    ready = not blockers
    if ready:
        ready_cell = "yes, installs" if requirements_state == TO_INSTALL else "yes"
    else:
        ready_cell = "no: " + ", ".join(blockers)
    return {
        "name": env.ref if env.reference else env.name,
        "ref": env.ref,
        "kind": env.kind,
        "deprecated_alias_of": env.alias_of,
        "num_repeats": env.benchmark.num_repeats if env.benchmark else None,
        "prompt_config": env.benchmark.prompt_config if env.benchmark else None,
        "prepare_script": env.benchmark.prepare_script if env.benchmark else None,
        "description": env.description,
        "source": env.source,
        "agent": agent.type if agent else None,
        "environment_server": _environment_server(env),
        "datasets": _dataset_names(env.datasets),
        "extra_deps": list(env.requirements),
        "extra_deps_state": requirements_state,
        "needs": needs,
        "needs_cell": _needs_cell(needs, env.judge_models),
        "variables": [
            {"name": v.name, "default": v.default, "required": v.required, "set": v.is_set, "where": v.where}
            for v in variables
        ],
        "variable_names": [f"{v.name}!" if v.required and not v.is_set else v.name for v in variables],
        "ready": ready,
        "not_ready_because": blockers,
        "cannot_start": env.broken,
        "ready_cell": ready_cell,
        "recorded": env.has_example_rollouts,
        "replay_not_reproducible": None if env.local else unreproducible_reason(env.name, gym_version=gym_version),
        "runnable": env.runs_offline_with_nemo_gym_only,
        "nemo_gym": gym_version,
        "judge_models": list(env.judge_models),
        "external_reasons": list(env.external_reasons),
        "network": [use.as_dict() for use in uses],
        "network_cell": network_cell(uses),
    }


def _named(name: str, root: Any, kind: str | None) -> list[Any]:
    """The environment an explicit form names (``resources_servers/NAME`` on a release that lists it by its short
    name), as eval resolves it, when of ``kind`` (``--kind``); none when it names nothing."""
    from .._gym import get_environment

    if "/" not in name:
        return []
    try:
        env = get_environment(name, root)
    except VerifiersNemoError:
        return []
    return [env] if not kind or env.kind == kind.replace("-", " ") else []


def _environment_server(env: Any) -> str | None:
    """The Gym environment server in front of the agent (nemo-gym 0.7: ``legacy_agent``, ``single_agent_turn``...),
    None when rollouts go to the agent itself (every 0.4 config)."""
    from .._gym.config import ENVIRONMENT_SERVERS

    servers = env.default_config.servers if env.default_config else ()
    return next((s.type for s in servers if s.kind == ENVIRONMENT_SERVERS), None)


def _benchmark_rows_present(env: Any) -> bool:
    """A benchmark's rows are where ``benchmark_data`` finds them: prepared in its tree, or in the offline folder."""
    from .._exceptions import TasksetError
    from .._tasks.benchmark_rows import benchmark_data

    try:
        benchmark_data(env)
    except TasksetError:
        return False
    return True


def _needs_cell(needs: list[str], judges: Sequence[str]) -> str:
    """The NEEDS column: ``judge: NAME, ...`` (the judge names ``--judge NAME=URL,MODEL`` takes; ``policy_model``
    when the policy grades itself), ``external``."""
    cells = [f"judge: {', '.join(dict.fromkeys(judges))}" if need == "judge" and judges else need for need in needs]
    return "; ".join(cells) or "-"


def _has_uv() -> bool:
    from .._gym.runtime import find_uv

    try:
        find_uv("")
    except VerifiersNemoError:
        return False
    return True


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


def _clip(text: str, width: int, tail: bool = False) -> str:
    """``text`` cut to ``width`` (a path keeps its end, where the environment's name is)."""
    if len(text) <= width:
        return text
    return "…" + text[-max(width - 1, 0) :] if tail else text[: max(width - 1, 0)] + "…"

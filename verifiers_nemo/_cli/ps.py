"""``verifiers-nemo ps``: what this package runs for you on this machine (stacks, the shared Ray head, warm parents,
``--ray`` clusters, their processes, ports and folders), and ``--clean``: stop what a killed run left."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .console import EXIT_OK

_COMMAND_WIDTH = 70


def cmd_ps(args: argparse.Namespace) -> int:
    from .._stack.inventory import clean, take_inventory

    inventory = take_inventory(_helpers_root())
    if args.clean:
        done = clean(inventory)
        for line in done:
            print(line, flush=True)
        print("Nothing was left over." if not done else f"Cleaned {len(done)} left-over item(s); logs are kept.")
        return EXIT_OK
    if args.json:
        print(json.dumps(_as_json(inventory), indent=2, default=str))
        return EXIT_OK
    print("\n".join(_lines(inventory)))
    return EXIT_OK


def _helpers_root() -> Path | None:
    from .._exceptions import StackStartError
    from .._stack.ray_head import ray_dir

    try:
        return ray_dir()
    except StackStartError:
        return None


def _lines(inventory: Any) -> list[str]:
    lines = [f"Stacks ({len(inventory.stacks)}):"]
    for stack in inventory.stacks:
        lines.append(f"  {stack.run_id}  {_owned(stack.owner, stack.owner_command)}")
        lines.append(f"    {_processes(stack.processes)}")
        lines.append(
            f"    run folder {stack.run_dir}{'' if stack.run_dir.exists() else ' (gone)'}; logs {stack.log_dir}"
        )
    lines.append(f"Shared helpers ({len(inventory.helpers)}):")
    for helper in inventory.helpers:
        supervisor = f"supervisor {helper.supervisor}" if helper.supervisor else "supervisor gone"
        held = f"held by {', '.join(map(str, helper.holders))}" if helper.holders else "held by no process: LEFT OVER"
        lines.append(f"  {helper.kind}  {helper.folder}  {supervisor}, {held}")
        lines.append(f"    {_processes(helper.processes)}")
        if helper.state.get("temp_dir"):
            lines.append(f"    Ray's files {helper.state['temp_dir']}; log {helper.state.get('log', '?')}")
    if inventory.ray_clusters:
        lines.append(f"Ray clusters of --ray ({len(inventory.ray_clusters)}):")
        for cluster in inventory.ray_clusters:
            lines.append(f"  {cluster.folder}  {_owned(cluster.owner, cluster.owner_command)}")
            lines.append(f"    {_processes(cluster.processes)}")
    lines.append("Folders: " + "; ".join(f"{name} {path}" for name, path in inventory.folders.items()))
    left = inventory.left_over
    if left:
        lines.append(
            f"Left over by runs that are gone: {len(left)}. `verifiers-nemo ps --clean` stops them and removes their "
            "folders (logs stay); nothing of a live run or of another user is touched."
        )
    else:
        lines.append("Nothing is left over.")
    return lines


def _owned(owner: int | None, command: str | None) -> str:
    if command is None:
        return f"LEFT OVER: its owner (pid {owner}) is gone"
    shown = command if len(command) <= _COMMAND_WIDTH else command[: _COMMAND_WIDTH - 1] + "…"
    return f"running for pid {owner} ({shown})"


def _processes(processes: Any) -> str:
    if not processes.pids:
        return "no process left"
    ports = ", ".join(map(str, processes.ports)) or "none"
    return f"{len(processes.pids)} process(es) {' '.join(map(str, processes.pids))}; listening on ports {ports}"


def _as_json(inventory: Any) -> dict[str, Any]:
    def item(obj: Any) -> dict[str, Any]:
        data = asdict(obj)
        data["left_over"] = obj.left_over
        data["processes"]["sessions"] = obj.processes.sessions
        return data

    return {
        "stacks": [item(s) | {"env": s.env} for s in inventory.stacks],
        "helpers": [item(h) | {"state": {k: v for k, v in h.state.items() if k != "token"}} for h in inventory.helpers],
        "ray_clusters": [item(c) for c in inventory.ray_clusters],
        "folders": {name: str(path) for name, path in inventory.folders.items()},
        "left_over": len(inventory.left_over),
    }

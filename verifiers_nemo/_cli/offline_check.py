"""``verifiers-nemo prepare ENV... --check``: would each environment start on this machine, and what does it still
need? Starts nothing: the Gym runtime found (the managed one built from the offline folder if it is not yet), each
server's packages installed or installable (a dry run of the same install), benchmark rows present, the platform
matching the folder's; then what the run must be given (a judge endpoint, variables, external services)."""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import VerifiersNemoError
from .console import EXIT_FAILED, EXIT_OK, PROG, fail, say

if TYPE_CHECKING:
    from .._gym import GymEnvironment, GymRuntime
    from .._offline import OfflineFolder


@dataclass
class Verdict:
    """What the check found for one environment."""

    name: str
    ready: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        head = f"{self.name}: {'would NOT start' if self.missing else 'would start'}"
        body = [f"  missing: {m}" for m in self.missing] + [f"  ok: {r}" for r in self.ready]
        body += [f"  the run needs: {n}" for n in self.needs]
        if any(n.startswith("the network, maybe") for n in self.needs):
            body.append("  (the network, maybe: a download call read in its servers' code; offline, a run fails there)")
        return [head, *body]


def cmd_check(args: argparse.Namespace) -> int:
    from .._gym import get_environment
    from .._offline import offline_folder

    try:
        folder = offline_folder()
        runtime, runtime_note = _runtime(args.gym_python, folder)
        if runtime is None:
            return fail(f"would not start: {runtime_note}", EXIT_FAILED)
        environments = [get_environment(name, runtime.root) for name in args.envs]
    except VerifiersNemoError as exc:
        return fail(str(exc))
    where = f"offline, from {folder.path}" if folder else "with the network (no offline folder named)"
    say(f"checking {len(environments)} environment(s) {where}; starting nothing")
    verdicts = []
    for env in environments:
        verdict = Verdict(env.ref)
        verdict.ready.append(runtime_note)
        _check_packages(env, runtime, folder, verdict)
        _check_data(env, verdict)
        _add_needs(env, runtime, verdict)
        verdicts.append(verdict)
        print("\n".join(verdict.lines()), flush=True)
    bad = [v.name for v in verdicts if v.missing]
    if bad:
        return fail(f"{len(bad)} of {len(verdicts)} would not start ({', '.join(bad)}): see missing above", EXIT_FAILED)
    say(f"all {len(verdicts)} would start; nothing was installed or started. Run `{PROG} prepare` to install now")
    return EXIT_OK


def _runtime(gym_python: str | None, folder: OfflineFolder | None) -> tuple[GymRuntime | None, str]:
    """The Gym runtime found here (built now from the offline folder when it is the managed one, not yet built:
    the environments' names are read from it), or None with why not."""
    import time

    from .._exceptions import GymRuntimeError
    from .._gym import find_gym_runtime, releases
    from .._offline.folder import python_target

    try:
        runtime = find_gym_runtime(gym_python, build=False)
    except GymRuntimeError as exc:
        if folder is None:
            return None, f"the Gym runtime: {exc} (`{PROG} prepare ENV` builds it, from the package index)"
        chosen, base, _ = releases.choose(None)
        folder.check_platform(*python_target(base))
        problem = _dry_run(base, [chosen.requirement], folder)
        if problem:
            return None, f"the Gym runtime ({chosen.requirement}) cannot be built from {folder.wheels}: {problem}"
        say(f"building the Gym runtime from the offline folder ({chosen.requirement} on {base}), once…")
        started = time.monotonic()
        runtime = find_gym_runtime(gym_python)
        took = time.monotonic() - started
        return runtime, f"the Gym runtime: built from the folder in {took:.0f}s ({runtime.python})"
    if folder is not None:
        folder.check_platform(*python_target(runtime.python))
    return runtime, f"the Gym runtime: nemo-gym {runtime.nemo_gym_version} ({runtime.python})"


def _check_packages(env: GymEnvironment, runtime: GymRuntime, folder: OfflineFolder | None, verdict: Verdict) -> None:
    from .._gym import requirements_beyond_nemo_gym
    from .._gym.derived_env import install_problem
    from .._stack.requirements import TO_INSTALL, requirement_states
    from .envs import _server_dirs

    wanted = {d: requirements_beyond_nemo_gym(d)[0] for d in _server_dirs(env)}
    for directory, state in requirement_states(wanted, runtime).items():
        packages = ", ".join(wanted[directory])
        if state != TO_INSTALL:
            verdict.ready.append(f"{directory.name}'s packages ({packages}): {state}")
            continue
        problem = install_problem(runtime, wanted[directory], base=directory)
        if problem is None:
            source = "the offline folder" if folder else "the package index"
            verdict.ready.append(f"{directory.name}'s packages ({packages}): install from {source} at the first start")
        else:
            fix = f"; {folder.gather_hint(env.ref)}" if folder else ""
            verdict.missing.append(f"{directory.name}'s packages ({packages}): {_last_lines(problem, 1)}{fix}")


def _check_data(env: GymEnvironment, verdict: Verdict) -> None:
    from .._exceptions import TasksetError
    from .._tasks.benchmark_rows import benchmark_data

    if env.benchmark is None:
        return
    try:
        verdict.ready.append(f"its rows: {benchmark_data(env)}")
    except TasksetError as exc:
        verdict.missing.append(f"its rows: {exc}")


def _add_needs(env: GymEnvironment, runtime: GymRuntime, verdict: Verdict) -> None:
    from .envs import _env_row

    row: dict[str, Any] = _env_row(env, {}, runtime.nemo_gym_version)
    judges = [j for j in row["judge_models"] if j != "policy_model"]
    if judges:
        verdict.needs.append(f"a judge endpoint: --judge {judges[0]}=URL,MODEL (reachable from this machine)")
    verdict.needs += [f"${v['name']} set" for v in row["variables"] if v["required"] and not v["set"]]
    verdict.needs += [f"an external service: {reason}" for reason in row["external_reasons"]]
    downloads = [use["detail"].removeprefix("may download at run time: ") for use in row["network"]]
    verdict.needs += [f"the network, maybe: {call}" for use, call in zip(row["network"], downloads, strict=True)
                      if use["what"] == "download"]  # fmt: skip


def _dry_run(python: Path, requirements: list[str], folder: OfflineFolder) -> str | None:
    """uv's reason when ``requirements`` cannot be installed from ``folder`` into a fresh venv of ``python``."""
    from .._gym.runtime import find_uv

    uv = find_uv("Checking an offline folder")
    with tempfile.TemporaryDirectory(prefix="verifiers-nemo-check-") as tmp:
        subprocess.run([*uv, "venv", "-q", "-p", str(python), tmp], check=True, capture_output=True)
        argv = [*uv, "pip", "install", "--dry-run", "-q", "-p", f"{tmp}/bin/python", *folder.uv_args(), *requirements]
        done = subprocess.run(argv, capture_output=True, text=True)
    return None if done.returncode == 0 else _last_lines(done.stderr)


def _last_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines[-count:])

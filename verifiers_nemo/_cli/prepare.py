"""``verifiers-nemo prepare ENV...``: do now what an environment's first start would do before its servers
run (build the Gym runtime if there is none, install the packages its servers need beyond nemo-gym, list the
modules the runtime's warm parent imports: ``_stack/warm_parent.py``), so that a first run (on every node of a
Ray cluster, in an image, in CI) starts at once."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .._exceptions import ConfigurationError, MissingRequirementsError, VerifiersNemoError
from .console import EXIT_FAILED, EXIT_OK, PROG, fail, say

if TYPE_CHECKING:
    from .._gym import GymEnvironment, GymRuntime


_ISOLATED_HINT = "run it with -a '{\"isolated_venvs\": true}'"


def cmd_prepare(args: argparse.Namespace) -> int:
    from .._gym import find_gym_runtime, get_environment

    if args.check:
        from .offline_check import cmd_check

        return cmd_check(args)
    try:
        runtime = find_gym_runtime(args.gym_python)
        environments = [get_environment(name, runtime.root) for name in args.envs]
    except VerifiersNemoError as exc:
        return fail(str(exc))
    failed = 0
    venvs: dict[str, list[Path]] = {}
    data: dict[str, list[tuple[str, Path]]] = {}
    for env in environments:
        prepared = _prepare_one(env, runtime)
        if prepared is None:
            failed += 1
            continue
        venvs[env.ref], data[env.ref] = prepared
    _prepare_warm_start(runtime)
    if args.gather and not failed:
        return _gather(args.gather, runtime, venvs, data)
    if args.gather:
        say(f"nothing gathered into {args.gather}: {failed} environment(s) could not be prepared")
    return EXIT_FAILED if failed else EXIT_OK


def _prepare_one(env: GymEnvironment, runtime: GymRuntime) -> tuple[list[Path], list[tuple[str, Path]]] | None:
    """Prepare ``env``: its derived venvs and its benchmark data file (under its Gym path); None when it failed."""
    from .._gym import POLICY_MODEL, merged_configs, server_instances
    from .._stack.own_servers import own_server_dirs
    from .._stack.requirements import server_venvs
    from .._tasks.benchmark_rows import benchmark_data

    if env.default_config is None:
        say(f"{env.name}: no config to prepare")
        return [], []
    started = time.monotonic()
    instances = [i for i in server_instances(merged_configs([env.default_config.path])) if i.name != POLICY_MODEL]
    try:
        server_dirs = dict(own_server_dirs([env.default_config.path], runtime.root))
        venvs = server_venvs(env.name, instances, runtime, server_dirs=server_dirs)
    except ConfigurationError as exc:
        say(f"{env.name}: cannot be prepared: {exc}")
        return None
    except MissingRequirementsError as exc:
        say(f"{env.name}: cannot be prepared: {exc.describe(_ISOLATED_HINT)}")
        return None
    files: list[tuple[str, Path]] = []
    if env.benchmark is not None:
        if not _prepare_benchmark_data(env):
            return None
        files.append((env.benchmark.jsonl_fpath, benchmark_data(env)))
    what = f"extra packages in {len(venvs)} server environment{'s' if len(venvs) != 1 else ''}"
    say(f"{env.name}: ready ({what if venvs else 'nothing to install'}; {time.monotonic() - started:.1f}s)")
    return [v for v in venvs.values() if v is not None], files


def _gather(
    target: str, runtime: GymRuntime, venvs: dict[str, list[Path]], data: dict[str, list[tuple[str, Path]]]
) -> int:
    """Gather what the prepared environments installed and downloaded into the folder ``target``."""
    from .._offline.gather import gather, managed_requirement

    requirement = managed_requirement(runtime)
    say(
        f"gathering into {target}: the wheels of {'the Gym runtime and ' if requirement else ''}"
        f"{sum(map(len, venvs.values()))} server environment(s), {sum(map(len, data.values()))} data file(s)…"
    )
    try:
        done = gather(Path(target), runtime, runtime_requirement=requirement, environments=venvs, data=data)
    except VerifiersNemoError as exc:
        return fail(str(exc))
    if requirement is None:
        say(
            f"the Gym runtime is your own interpreter ({runtime.python}, nemo-gym {runtime.nemo_gym_version}): "
            "not gathered; bring it to the offline machine (or gather with the managed one: unset "
            "VERIFIERS_NEMO_GYM_PYTHON, in an interpreter without nemo-gym)"
        )
    say(
        f"gathered {done.pins} packages ({done.wheels} wheels in the folder) and {len(done.data)} data file(s) into "
        f"{done.folder.path}: {done.size_bytes / 2**20:.1f} MiB, {done.seconds:.1f}s. On the offline machine: "
        f"VERIFIERS_NEMO_OFFLINE_DIR=DIR {PROG} prepare ENV... --check"
    )
    return EXIT_OK


def _prepare_benchmark_data(env: GymEnvironment) -> bool:
    """A benchmark's rows, written by its own prepare script when they are not there yet; False when it failed."""
    from .._exceptions import TasksetError
    from .._tasks.benchmark_rows import benchmark_data, prepare_benchmark

    try:
        say(f"{env.name}: data at {benchmark_data(env)}")
        return True
    except TasksetError:
        pass
    script = env.benchmark.prepare_script if env.benchmark else None
    say(f"{env.name}: preparing its data with {script} (it downloads them, as gym eval prepare does)…")
    try:
        say(f"{env.name}: data written to {prepare_benchmark(env)}")
    except TasksetError as exc:
        say(f"{env.name}: cannot be prepared: {exc}")
        return False
    return True


def _prepare_warm_start(runtime: GymRuntime) -> None:
    """List, once, the modules the runtime's warm parent imports (what a first warm start would do)."""
    from .._stack.config import StackConfig
    from .._stack.stack import warm_parent_env
    from .._stack.warm_parent import WarmStartUnavailable, probe

    started = time.monotonic()
    try:
        _, listed = probe(runtime, warm_parent_env(StackConfig("prepare", (), ""), runtime))
    except WarmStartUnavailable as exc:
        say(f"warm start: unavailable ({exc}); Gym processes will start the plain way")
        return
    say(f"warm start: {len(listed['modules'])} modules of Gym's imports listed ({time.monotonic() - started:.1f}s)")

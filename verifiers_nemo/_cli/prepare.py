"""``verifiers-nemo prepare ENV...``: do now what an environment's first start would do before its servers
run (build the Gym runtime if there is none, install the packages its servers need beyond nemo-gym, list the
modules the runtime's warm parent imports: ``_stack/warm_parent.py``), so that a first run (on every node of a
Ray cluster, in an image, in CI) starts at once."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from .._exceptions import ConfigurationError, MissingRequirementsError, VerifiersNemoError
from .console import EXIT_FAILED, EXIT_OK, fail, say

if TYPE_CHECKING:
    from .._gym import GymEnvironment, GymRuntime


def cmd_prepare(args: argparse.Namespace) -> int:
    from .._gym import POLICY_MODEL, find_gym_runtime, get_environment, merged_configs, server_instances
    from .._stack.own_servers import own_server_dirs
    from .._stack.requirements import server_venvs

    try:
        runtime = find_gym_runtime(args.gym_python)
        environments = [get_environment(name, runtime.root) for name in args.envs]
    except VerifiersNemoError as exc:
        return fail(str(exc))
    failed = 0
    for env in environments:
        if env.default_config is None:
            say(f"{env.name}: no config to prepare")
            continue
        started = time.monotonic()
        instances = [i for i in server_instances(merged_configs([env.default_config.path])) if i.name != POLICY_MODEL]
        try:
            server_dirs = dict(own_server_dirs([env.default_config.path], runtime.root))
            venvs = server_venvs(env.name, instances, runtime, server_dirs=server_dirs)
        except ConfigurationError as exc:
            failed += 1
            say(f"{env.name}: cannot be prepared: {exc}")
            continue
        except MissingRequirementsError as exc:
            failed += 1
            say(f"{env.name}: cannot be prepared: {exc.describe('run it with -a \'{"isolated_venvs": true}\'')}")
            continue
        if env.benchmark is not None and not _prepare_benchmark_data(env):
            failed += 1
            continue
        what = f"extra packages in {len(venvs)} server environment{'s' if len(venvs) != 1 else ''}"
        say(f"{env.name}: ready ({what if venvs else 'nothing to install'}; {time.monotonic() - started:.1f}s)")
    _prepare_warm_start(runtime)
    return EXIT_FAILED if failed else EXIT_OK


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

"""``verifiers-nemo prepare ENV...``: do now what an environment's first start would do before its servers
run — build the Gym runtime if there is none and install the packages its servers need beyond nemo-gym —
so that a first run (on every node of a Ray cluster, in an image, in CI) starts at once."""

from __future__ import annotations

import argparse
import time

from .._exceptions import MissingRequirementsError, VerifiersNemoError
from .console import EXIT_FAILED, EXIT_OK, fail, say


def cmd_prepare(args: argparse.Namespace) -> int:
    from .._gym import POLICY_MODEL, find_gym_runtime, get_environment, merged_configs, server_instances
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
            venvs = server_venvs(env.name, instances, runtime)
        except MissingRequirementsError as exc:
            failed += 1
            say(f"{env.name}: cannot be prepared: {exc.describe('run it with -a \'{"isolated_venvs": true}\'')}")
            continue
        what = f"extra packages in {len(venvs)} server environment{'s' if len(venvs) != 1 else ''}"
        say(f"{env.name}: ready ({what if venvs else 'nothing to install'}; {time.monotonic() - started:.1f}s)")
    return EXIT_FAILED if failed else EXIT_OK

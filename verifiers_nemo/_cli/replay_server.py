"""``verifiers-nemo replay-server``: an environment's recorded rollouts served as a model, for vf-eval."""

from __future__ import annotations

import argparse

from .._exceptions import VerifiersNemoError
from .console import fail


def cmd_replay_server(args: argparse.Namespace) -> int:
    from .._replay.serve import replay_server, serve_forever

    if not args.env and not args.jsonl_path:
        return fail(
            "name the environment whose recorded rollouts to serve (ENV), or pass --jsonl-path FILE whose rows "
            "name their agent (agent_ref)."
        )
    try:
        upstream = replay_server(args.env, jsonl_path=args.jsonl_path)
    except VerifiersNemoError as exc:
        return fail(str(exc))
    try:
        return serve_forever(upstream, nemo_env=args.env, port_file=args.port_file)
    except VerifiersNemoError as exc:
        return fail(str(exc))

"""The eval flags as ``EvalSettings``: a fresh run's, or a resumed run's (its saved settings, with
only the flags that may change between sessions applied)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigurationError

if TYPE_CHECKING:
    from .._eval import EvalSettings

DEFAULTS: dict[str, Any] = {
    "rollouts_per_example": 1,
    "max_concurrent": 32,
    "timeout": 600.0,
    "api": "responses",
    "pass_threshold": 0.5,
}


def _explicit(args: argparse.Namespace) -> dict[str, Any]:
    """The eval flags the user gave (argparse defaults are None so absence is visible)."""
    names = (
        "model",
        "base_url",
        "api_key_var",
        "api",
        "policy",
        "num_examples",
        "rollouts_per_example",
        "max_concurrent",
        "timeout",
        "env_args",
        "sampling_args",
        "save_trace",
        "pass_threshold",
        "ray",
        "workers",
        "cpus_per_stack",
        "exact_tokens",
    )
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _sampling_args(args: argparse.Namespace) -> dict[str, Any]:
    sampling = dict(args.sampling_args or {})
    if args.max_tokens is not None:
        sampling.pop("max_output_tokens", None)
        sampling["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if getattr(args, "return_tokens", False):
        sampling["return_tokens"] = True  # Endpoint.return_tokens, as a sampling arg
    return sampling


def new_settings(args: argparse.Namespace) -> EvalSettings:
    """Settings of a fresh run from the flags (raises ConfigurationError on a bad combination)."""
    from .._eval import REPLAY_MODEL, EvalSettings, resolve_nemo_env

    if not args.env:
        raise ConfigurationError("name the environment to evaluate (ENV), or resume a run with -R DIR.")
    policy = args.policy or ("endpoint" if args.base_url else "replay")
    if policy == "replay":
        if args.base_url:
            raise ConfigurationError(
                "--policy replay answers with recorded rollouts; drop -b (or use --policy endpoint)."
            )
        if args.model:
            raise ConfigurationError(
                "-m needs an endpoint: add -b URL (without -b the recorded rollouts are replayed)."
            )
        if args.api_key_var:
            raise ConfigurationError("-k needs an endpoint: add -b URL (the replay policy needs no key).")
    elif not args.base_url:
        raise ConfigurationError("--policy endpoint needs -b URL (the OpenAI-compatible base URL).")
    if (args.workers or args.cpus_per_stack) and not args.ray:
        raise ConfigurationError("--workers and --cpus-per-stack place Ray actors: add --ray [ADDRESS].")
    env_args = dict(args.env_args or {})
    return EvalSettings(
        env=args.env,
        nemo_env=resolve_nemo_env(args.env, env_args),
        policy=policy,
        model=REPLAY_MODEL if policy == "replay" else (args.model or ""),
        base_url=args.base_url,
        api=args.api or DEFAULTS["api"],
        api_key_var=args.api_key_var,
        num_examples=args.num_examples,
        rollouts_per_example=args.rollouts_per_example or DEFAULTS["rollouts_per_example"],
        max_concurrent=args.max_concurrent or DEFAULTS["max_concurrent"],
        sampling_args=_sampling_args(args),
        env_args=env_args,
        timeout=args.timeout or DEFAULTS["timeout"],
        pass_threshold=DEFAULTS["pass_threshold"] if args.pass_threshold is None else args.pass_threshold,
        save_trace=bool(args.save_trace),
        judges=judge_settings(args),
        ray=args.ray,
        workers=args.workers,
        cpus_per_stack=args.cpus_per_stack,
    )


def judge_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The judges the flags name: ``--judge-base-url``/``--judge-model`` as ``*``, each ``--judge NAME=URL,MODEL``."""
    api = getattr(args, "judge_api", None) or "responses"
    key_var = getattr(args, "judge_api_key_var", None)
    judges: dict[str, dict[str, Any]] = {}
    base_url, model = getattr(args, "judge_base_url", None), getattr(args, "judge_model", None)
    if base_url or model:
        if not (base_url and model):
            raise ConfigurationError("--judge-base-url and --judge-model go together (the judge's URL and model).")
        judges["*"] = {"base_url": base_url, "model": model, "api": api, "api_key_var": key_var}
    for spec in getattr(args, "judge", None) or []:
        name, _, rest = spec.partition("=")
        url, _, model = rest.rpartition(",")
        if not name.strip() or not url.strip() or not model.strip():
            raise ConfigurationError(
                f"--judge {spec!r}: expected NAME=URL,MODEL, e.g. --judge genrm_model=http://127.0.0.1:8001/v1,Qwen/Qwen3-8B"
            )
        judges[name.strip()] = {"base_url": url.strip(), "model": model.strip(), "api": api, "api_key_var": key_var}
    if not judges and (key_var or getattr(args, "judge_api", None)):
        raise ConfigurationError(
            "--judge-api-key-var and --judge-api need a judge: --judge-base-url URL --judge-model M."
        )
    return judges


def resumed_settings(args: argparse.Namespace, saved: EvalSettings) -> EvalSettings:
    """The saved settings with the flags that may change between sessions applied; others must agree."""
    from dataclasses import replace

    from .._eval import RUN_DEFINING

    given = _explicit(args)
    if (
        args.sampling_args is not None
        or args.max_tokens is not None
        or args.temperature is not None
        or getattr(args, "return_tokens", False)
    ):
        given["sampling_args"] = _sampling_args(args)
    if args.env is not None:
        given["env"] = args.env
    if args.output_dir is not None:
        raise ConfigurationError("-o has no effect with -R: the run's folder is DIR itself.")
    flags = {"env": "ENV", "model": "-m", "api": "--api", "policy": "--policy", "num_examples": "-n"}
    flags |= {
        "rollouts_per_example": "-r",
        "sampling_args": "-S/-t/-T",
        "env_args": "-a",
        "save_trace": "--save-trace",
        "exact_tokens": "--exact-tokens",
    }
    for name in RUN_DEFINING:
        if name in given and given[name] != getattr(saved, name):
            raise ConfigurationError(
                f"{flags.get(name, name)} {given[name]!r} differs from the resumed run's "
                f"{_saved_value(name, getattr(saved, name))}; a resumed run keeps its settings "
                "(start a new run to change it)."
            )
    if saved.policy == "replay" and args.base_url:
        raise ConfigurationError("the resumed run replays recorded rollouts; drop -b.")
    changes = {k: v for k, v in given.items() if k not in RUN_DEFINING}
    judges = judge_settings(args)
    if judges:  # a resumed run keeps its judges unless given again
        changes["judges"] = judges
    return replace(saved, **changes)


def _saved_value(name: str, value: Any) -> str:
    """A saved setting as the user would say it (None and empty values mean the default)."""
    if value is None or value == {}:
        return {"num_examples": "(all examples)", "model": "(no model)"}.get(name, "(not set)")
    return repr(value)

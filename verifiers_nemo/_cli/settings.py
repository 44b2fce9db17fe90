"""The eval flags as ``EvalSettings``: a fresh run's, or a resumed run's (its saved settings, with only the
flags that may change between sessions applied).

``FIELDS`` is the one mapping from the eval parser's flags (argparse ``dest``) to the ``EvalSettings`` field each
sets; ``CONSUMED_ELSEWHERE`` names the flags that set no field and where they act. Fresh and resumed runs read the
flags only through ``given_fields``, so a flag in the mapping cannot be parsed and dropped.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigurationError

if TYPE_CHECKING:
    from .._eval import EvalSettings


@dataclass(frozen=True)
class SettingFlags:
    """An ``EvalSettings`` field the flags set: from which flags (argparse dests), named how in messages."""

    flags: tuple[str, ...]
    label: str


FIELDS: dict[str, SettingFlags] = {
    "env": SettingFlags(("env",), "ENV"),
    "model": SettingFlags(("model",), "-m"),
    "base_url": SettingFlags(("base_url",), "-b"),
    "api_key_var": SettingFlags(("api_key_var",), "-k"),
    "api": SettingFlags(("api",), "--api"),
    "policy": SettingFlags(("policy",), "--policy"),
    "policy_script": SettingFlags(("policy_script",), "--policy-script"),
    "num_examples": SettingFlags(("num_examples",), "-n"),
    "rollouts_per_example": SettingFlags(("rollouts_per_example",), "-r"),
    "max_concurrent": SettingFlags(("max_concurrent",), "-c"),
    "timeout": SettingFlags(("timeout",), "--timeout"),
    "env_args": SettingFlags(("env_args",), "-a"),
    "sampling_args": SettingFlags(("sampling_args", "max_tokens", "temperature", "return_tokens"), "-S/-t/-T"),
    "save_trace": SettingFlags(("save_trace",), "--save-trace"),
    "pass_threshold": SettingFlags(("pass_threshold",), "--pass-threshold"),
    "judges": SettingFlags(("judge_base_url", "judge_model", "judge_api_key_var", "judge_api", "judge"), "--judge*"),
    "ray": SettingFlags(("ray",), "--ray"),
    "workers": SettingFlags(("workers",), "--workers"),
    "cpus_per_stack": SettingFlags(("cpus_per_stack",), "--cpus-per-stack"),
    "exact_tokens": SettingFlags(("exact_tokens",), "--exact-tokens"),
    "client_type": SettingFlags(("client_type",), "--client-type"),
    "renderer": SettingFlags(("renderer",), "--renderer"),
    "renderer_model": SettingFlags(("renderer_model",), "--renderer-model"),
    "renderer_config": SettingFlags(("renderer_config",), "--renderer-config"),
    "generate_shape": SettingFlags(("generate_shape",), "--generate-shape"),
}
"""``EvalSettings`` field → the flags that set it (``nemo_env`` is derived from ENV and ``-a``)."""

CONSUMED_ELSEWHERE: dict[str, str] = {
    "save": "cmd_eval: save a run folder",
    "output_dir": "cmd_eval: where the run folder goes (refused with -R)",
    "resume": "cmd_eval: the run folder whose saved settings are resumed",
    "report": "cmd_eval: write report.html at the end",
    "verbose": "main: the log level",
    "gym_root": "main: VERIFIERS_NEMO_GYM_ROOT, where names are looked up (a run saves each found folder's path)",
    "offline_dir": "main: VERIFIERS_NEMO_OFFLINE_DIR, the gathered folder installs come from (_offline/folder.py)",
}
"""Eval flags that set no ``EvalSettings`` field, and what reads them."""


def _is_given(value: Any) -> bool:
    """Whether a flag was given: the eval flags default to None (store_true ones may default to False)."""
    return value is not None and value is not False


def _sampling_args(args: argparse.Namespace) -> dict[str, Any]:
    sampling = dict(args.sampling_args or {})
    if args.max_tokens is not None:
        sampling.pop("max_output_tokens", None)
        sampling["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.return_tokens:
        sampling["return_tokens"] = True  # Endpoint.return_tokens, as a sampling arg
    return sampling


_COMBINED = {"sampling_args": _sampling_args, "judges": lambda args: judge_settings(args)}
"""Fields several flags build together (one flag each otherwise)."""


def given_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``EvalSettings`` fields the user's flags set (absent flags leave their field out)."""
    given: dict[str, Any] = {}
    for name, spec in FIELDS.items():
        if not any(_is_given(getattr(args, dest)) for dest in spec.flags):
            continue
        given[name] = _COMBINED[name](args) if name in _COMBINED else getattr(args, spec.flags[0])
    return given


def new_settings(args: argparse.Namespace) -> EvalSettings:
    """Settings of a fresh run from the flags (raises ConfigurationError on a bad combination)."""
    from .._eval import ENV_PACKAGE, REPLAY_MODEL, EvalSettings, benchmark_repeats, resolve_nemo_env
    from .._policy_script import SCRIPT_MODEL

    given = given_fields(args)
    if not given.get("env"):
        raise ConfigurationError("name the environment to evaluate (ENV), or resume a run with -R DIR.")
    default_policy = "script" if "policy_script" in given else "endpoint" if "base_url" in given else "replay"
    policy = given.setdefault("policy", default_policy)
    if policy == "script" or "policy_script" in given:
        _check_script_policy(given)
    elif policy == "replay":
        if "base_url" in given:
            raise ConfigurationError(
                "--policy replay answers with recorded rollouts; drop -b (or use --policy endpoint)."
            )
        if "model" in given:
            raise ConfigurationError(
                "-m needs an endpoint: add -b URL (without -b the recorded rollouts are replayed)."
            )
        if "api_key_var" in given:
            raise ConfigurationError("-k needs an endpoint: add -b URL (the replay policy needs no key).")
        if "exact_tokens" in given:
            raise ConfigurationError(
                "--exact-tokens needs a vLLM endpoint started with --enable-scale-out: add -b URL -m MODEL."
            )
    elif "base_url" not in given:
        raise ConfigurationError("--policy endpoint needs -b URL (the OpenAI-compatible base URL).")
    if ("workers" in given or "cpus_per_stack" in given) and "ray" not in given:
        raise ConfigurationError("--workers and --cpus-per-stack place Ray actors: add --ray [ADDRESS].")
    _check_training_client(given, policy)
    given["nemo_env"] = resolve_nemo_env(given["env"], given.get("env_args", {}))
    if given["env"] not in (ENV_PACKAGE, ENV_PACKAGE.replace("-", "_")):
        given["env"] = given["nemo_env"]  # a folder of yours by its absolute path: a resume elsewhere finds it
    given["model"] = {"replay": REPLAY_MODEL, "script": SCRIPT_MODEL}.get(policy) or given.get("model", "")
    if "rollouts_per_example" not in given and (repeats := benchmark_repeats(given["nemo_env"])):
        given["rollouts_per_example"] = repeats  # Gym's own default for its benchmarks (num_repeats); -r overrides
    return EvalSettings(**given)


def _check_script_policy(given: dict[str, Any]) -> None:
    """A policy script answers as the model, in this process: no endpoint, key or engine goes with it."""
    from .._policy_script import load_policy_function, split_policy_spec

    if given["policy"] != "script":
        raise ConfigurationError(
            f"--policy-script answers as the model: drop --policy {given['policy']} (or drop --policy-script)."
        )
    if "policy_script" not in given:
        raise ConfigurationError(
            "--policy script needs --policy-script FILE.py[:NAME] (the function that answers as the model)."
        )
    for name, why in (
        ("base_url", "-b: a policy script is the model; drop -b (or drop --policy-script)"),
        ("model", "-m: a policy script answers as the model 'script'; drop -m"),
        ("api_key_var", "-k: a policy script needs no key; drop -k"),
        ("exact_tokens", "--exact-tokens needs a vLLM endpoint; a policy script samples no tokens: drop it"),
        ("ray", "--ray: a policy script runs in this process, Ray actors elsewhere cannot call it: drop --ray"),
    ):
        if name in given:
            raise ConfigurationError(f"--policy-script with {why}.")
    if given.get("client_type") == "train":
        raise ConfigurationError(
            "--client-type train samples from an engine's token route, which a policy script has none of: drop it."
        )
    load_policy_function(given["policy_script"])  # refused now, in one line, not in every rollout
    path, name = split_policy_spec(given["policy_script"])
    given["policy_script"] = f"{path.resolve()}:{name}"  # a resume from elsewhere finds it


_TRAINING_ONLY = ("renderer", "renderer_model", "renderer_config", "generate_shape")
_NOT_WITH_TRAINING = {
    "exact_tokens": "--exact-tokens (the training client renders and samples tokens itself)",
    "ray": "--ray (the training client runs its episodes in this process, as a verifiers env server's worker does)",
}


def _check_training_client(given: dict[str, Any], policy: str) -> None:
    """The training client's flags go together, and with nothing it replaces."""
    if given.get("client_type", "eval") != "train":
        for name in _TRAINING_ONLY:
            if name in given:
                what = "reply shape" if name == "generate_shape" else "renderer"
                raise ConfigurationError(
                    f"{FIELDS[name].label} sets the training client's {what}: add --client-type train."
                )
        return
    for name, what in _NOT_WITH_TRAINING.items():
        if name in given:
            raise ConfigurationError(f"--client-type train does not take {what}.")
    if given.get("api") == "responses":
        raise ConfigurationError(
            "--client-type train speaks Chat Completions (verifiers' training client): drop --api responses."
        )
    if (given.get("sampling_args") or {}).get("return_tokens"):
        raise ConfigurationError("--client-type train records token IDs itself: drop --return-tokens.")
    given["api"] = "chat"
    if "generate_shape" in given and policy != "replay":
        raise ConfigurationError(
            "--generate-shape sets the replay engine's reply shape; an engine at -b answers in its own: drop it."
        )
    if policy == "replay" and "renderer_model" not in given:
        raise ConfigurationError(
            "--client-type train with the replay policy needs --renderer-model NAME_OR_DIR: the model whose "
            "tokenizer writes the recorded turns as tokens (e.g. a local folder with Qwen3's tokenizer files)."
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
    """The saved settings with the flags that may change between sessions applied; others must agree
    (a resumed run keeps its judges unless given again)."""
    from .._eval import RUN_DEFINING

    if args.output_dir is not None:
        raise ConfigurationError("-o has no effect with -R: the run's folder is DIR itself.")
    given = given_fields(args)
    if "policy_script" in given:  # as the run saved it
        from .._policy_script import split_policy_spec

        path, name = split_policy_spec(given["policy_script"])
        given["policy_script"] = f"{path.resolve()}:{name}"
    for name in RUN_DEFINING:
        if name in given and given[name] != getattr(saved, name):
            label = FIELDS[name].label if name in FIELDS else name
            raise ConfigurationError(
                f"{label} {given[name]!r} differs from the resumed run's "
                f"{_saved_value(name, getattr(saved, name))}; a resumed run keeps its settings "
                "(start a new run to change it)."
            )
    if saved.policy == "replay" and "base_url" in given:
        raise ConfigurationError("the resumed run replays recorded rollouts; drop -b.")
    if saved.policy == "script" and "base_url" in given:
        raise ConfigurationError(f"the resumed run's model is the policy script {saved.policy_script}; drop -b.")
    return replace(saved, **{k: v for k, v in given.items() if k not in RUN_DEFINING})


def _saved_value(name: str, value: Any) -> str:
    """A saved setting as the user would say it (None and empty values mean the default)."""
    if value is None or value == {}:
        return {"num_examples": "(all examples)", "model": "(no model)"}.get(name, "(not set)")
    return repr(value)

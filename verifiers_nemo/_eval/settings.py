"""What defines an eval run: ``EvalSettings`` (saved in ``metadata.json``), which of them a resumed
run must keep, and the checks of the environment args (``-a``) and the environment an ENV names."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from .._exceptions import ConfigurationError, UnknownEnvironmentError

Policy = Literal["replay", "endpoint", "script"]

ENV_PACKAGE = "nemo-gym-env"
"""The installable environment package; its Gym environment comes from ``env_args["nemo_env"]``."""
REPLAY_MODEL = "replay"
MIX_STRIDE = 1_000_000
"""In a run of several environments, the task index of row ``r`` of the ``i``-th one is ``i * MIX_STRIDE + r``:
unique across the mix and the same in every session (resume)."""

# Arguments the eval command sets itself; env args may not set them.
_OWNED_ARGS = frozenset({"num_examples", "rollouts_per_example", "recorded", "timeout", "taskset", "root"})


@dataclass
class EvalSettings:
    """Everything that defines an eval run; saved in ``metadata.json`` (it never holds a secret)."""

    env: str
    """What the user named: a packaged Gym environment, or ``nemo-gym-env``."""
    nemo_env: str
    """The packaged Gym environment that runs."""
    policy: Policy
    model: str
    base_url: str | None = None
    api: Literal["responses", "chat"] = "responses"
    api_key_var: str | None = None
    """The *name* of the environment variable holding the API key."""
    num_examples: int | None = None
    rollouts_per_example: int = 1
    max_concurrent: int = 32
    sampling_args: dict[str, Any] = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0
    pass_threshold: float = 0.5
    save_trace: bool = False
    judges: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Judge name (``*``: every other name) → ``{base_url, model, api, api_key_var}`` (no key itself)."""
    ray: str | None = None
    """Run on Ray actors: ``local`` (a cluster started for the run) or a cluster's address; None: here."""
    workers: int | None = None
    """Ray actors (each one Gym stack); None: by ``cpus_per_stack`` when given, else one per live node."""
    cpus_per_stack: float | None = None
    """CPUs each Ray actor reserves (None: 1)."""
    exact_tokens: bool = False
    """Training-exact tokens (``Endpoint.exact_tokens``): vLLM's render / generate / derender routes."""
    client_type: Literal["eval", "train"] = "eval"
    """``train``: run each rollout as a verifiers episode under its training client (``client.type = "train"``: a
    renderer renders, an engine's ``/inference/v1/generate`` samples, the turns become training samples), the way
    prime-rl trains; ``eval``: the Gym agent's calls go to the endpoint as they are."""
    renderer: str | None = None
    """The training client's renderer: a typed one (``qwen3``, ``auto``...) or ``FILE.py:Class`` (default auto)."""
    renderer_model: str | None = None
    """The model (Hugging Face name or local folder) whose tokenizer the renderer uses (default: ``model``)."""
    renderer_config: dict[str, Any] = field(default_factory=dict)
    """More ``[client.renderer]`` keys (a custom renderer's own, ``thinking_retention``, ``chat_template``...)."""
    policy_script: str | None = None
    """``policy == "script"``: the function that answers as the model, ``/abs/FILE.py:NAME``."""
    generate_shape: str | None = None
    """The replay engine's ``/inference/v1/generate`` reply shape under the training client: ``vllm-0.31`` (the
    default; prime-rl's inference server's too), ``vllm-0.32`` or ``vllm-0.33`` (with weight versions)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def env_names(self) -> list[str]:
        """The Gym environments of the run: one, or a mix (``nemo_env`` ``a,b``)."""
        return self.nemo_env.split(",")

    def origin(self, task_index: int) -> tuple[str, int]:
        """The environment and row of a task index (a mix numbers env ``i``'s rows from ``i * MIX_STRIDE``)."""
        names = self.env_names
        if len(names) == 1:
            return names[0], task_index
        return names[task_index // MIX_STRIDE], task_index % MIX_STRIDE

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalSettings:
        """Settings as saved by ``to_dict`` (unknown keys are ignored, so older folders still load)."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ConfigurationError(f"the saved settings are incomplete: {exc}") from None


# Settings that decide which rollouts exist and what they mean: fixed for the life of a results folder.
RUN_DEFINING = (
    "env",
    "nemo_env",
    "policy",
    "policy_script",
    "model",
    "api",
    "num_examples",
    "rollouts_per_example",
    "sampling_args",
    "env_args",
    "save_trace",
    "exact_tokens",
    "client_type",
    "renderer",
    "renderer_model",
    "renderer_config",
    "generate_shape",
)


def env_arg_names() -> frozenset[str]:
    """The keys ``-a`` accepts: ``load_environment``'s and ``NeMoGymHarness``'s keyword arguments."""
    from .._factory import load_environment
    from .._harness import NeMoGymHarness

    names = set(inspect.signature(load_environment).parameters)
    names |= set(inspect.signature(NeMoGymHarness.__init__).parameters)
    names -= {"self", "harness_args", "secrets", "proxy"}  # never from -a: saved in metadata.json, not JSON
    return frozenset(names - _OWNED_ARGS)


def check_env_args(env_args: Mapping[str, Any]) -> None:
    """Every ``-a`` key is one the environment takes (else one error listing the accepted keys)."""
    accepted = env_arg_names() | {"nemo_env"}
    for key in env_args:
        if key in _OWNED_ARGS:
            raise ConfigurationError(
                f"-a: {key!r} is set by the eval command's flags (-n, -r, --timeout, --policy); use those."
            )
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigurationError(
                f"-a: unknown environment arg {key!r}{hint}. Accepted: {', '.join(sorted(accepted))}."
            )


def benchmark_repeats(nemo_env: str) -> int | None:
    """The rollouts per example Gym runs the benchmarks among ``nemo_env`` with (their ``num_repeats``; the largest
    when a mix names several), None when it names none."""
    from .._gym import get_environment

    repeats = []
    for name in nemo_env.split(","):
        try:
            env = get_environment(name)
        except UnknownEnvironmentError:  # the run itself says so, with its closest names
            continue
        if env.benchmark is not None:
            repeats.append(env.benchmark.num_repeats)
    return max(repeats) if repeats else None


def resolve_nemo_env(env: str, env_args: Mapping[str, Any]) -> str:
    """The Gym environment(s) an ENV argument names (``nemo-gym-env`` reads ``env_args["nemo_env"]``;
    ``a,b`` is a mix of environments in one run)."""
    if env in (ENV_PACKAGE, ENV_PACKAGE.replace("-", "_")):
        nemo_env = env_args.get("nemo_env")
        if not isinstance(nemo_env, str) or not nemo_env:
            raise ConfigurationError(
                f'{env} needs the Gym environment to run: pass -a \'{{"nemo_env": "example_multi_step"}}\' '
                "(`verifiers-nemo envs` lists them)."
            )
        env = nemo_env
    elif "nemo_env" in env_args and env_args["nemo_env"] != env:
        raise ConfigurationError(
            f"-a sets nemo_env={env_args['nemo_env']!r} but ENV is {env!r}; name one environment "
            f"(use ENV {ENV_PACKAGE} with -a nemo_env, or drop nemo_env from -a)."
        )
    from .._gym import canonical_reference

    names = [name.strip() for name in env.split(",")]
    if not all(names):
        raise ConfigurationError(
            f"ENV {env!r}: name each environment once, separated by commas (e.g. example_multi_step,"
            "example_single_tool_call)."
        )
    names = [canonical_reference(name) for name in names]  # a folder of yours: by its absolute path
    if len(set(names)) != len(names):
        raise ConfigurationError(
            f"ENV {env!r}: name each environment once, separated by commas (e.g. example_multi_step,"
            "example_single_tool_call)."
        )
    return ",".join(names)

"""What the catalogue knows of an environment: its configs, agents, datasets and servers, as plain data."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from ..._exceptions import ConfigurationError
from ..config import POLICY_MODEL, RESOURCES_SERVERS, RESPONSES_API_MODELS
from ..tree import GymTree
from .gym_listing import RESOURCES_SERVER, BenchmarkSpec

EXAMPLE_ROLLOUTS = "data/example_rollouts.jsonl"
"""Where an environment keeps its recorded rollouts, relative to its directory."""


@dataclass(frozen=True)
class GymDataset:
    """A JSONL dataset an agent instance names in its config (``datasets:``)."""

    name: str
    type: str | None
    """Gym's dataset type: ``example``, ``train`` or ``validation``."""
    jsonl_fpath: str
    """As written in the config: relative to the Gym root."""
    path: Path
    exists: bool
    """Whether the file is there (shipped with nemo-gym, or downloaded since)."""
    agent: str
    """The agent instance whose config lists the dataset."""
    config: Path
    source: str | None = None
    """Where Gym downloads it from when it is not shipped (``huggingface:...``, ``gitlab:...``)."""
    prompt_config: str | None = None
    """A prompt template Gym applies to rows before sending them (rows then carry no input)."""


@dataclass(frozen=True)
class GymAgent:
    """An agent instance: a top-level config entry of kind ``responses_api_agents``."""

    name: str
    type: str
    """The agent implementation, a directory under ``responses_api_agents/``."""
    config: Path
    resources_server: str | None
    model_server: str | None
    datasets: tuple[GymDataset, ...]
    max_steps: int | None
    requirements: tuple[str, ...]
    """Python requirements of the agent implementation beyond nemo-gym itself."""


@dataclass(frozen=True)
class GymServer:
    """A top-level config entry: instance name, kind (``resources_servers``...) and type (directory)."""

    name: str
    kind: str
    type: str


class _Needs:
    """What a config (or an environment, by its default config) needs beyond Gym, as booleans."""

    judge_models: tuple[str, ...]
    external_reasons: tuple[str, ...]

    @property
    def needs_judge(self) -> bool:
        """A resources server calls a model while scoring (see ``classify_config``)."""
        return bool(self.judge_models)

    @property
    def needs_external(self) -> bool:
        """A service, credential or download is needed (see ``classify_config``)."""
        return bool(self.external_reasons)


@dataclass(frozen=True)
class GymConfig(_Needs):
    """One config YAML of an environment and what running it needs."""

    path: Path
    relpath: str
    """Relative to the Gym root, as Gym's ``+config_paths=[...]`` takes it."""
    servers: tuple[GymServer, ...]
    agents: tuple[GymAgent, ...]
    judge_models: tuple[str, ...]
    """Model servers (or endpoints) the resources server calls while scoring; see ``classify_config``."""
    external_reasons: tuple[str, ...]
    """Why the config needs something outside Gym and this machine; see ``classify_config``."""
    requirements: tuple[str, ...]
    """Python requirements beyond nemo-gym of its resources servers and agents."""
    problems: tuple[str, ...] = ()
    model_adapters: tuple[str, ...] = ()
    """The only Gym model servers (``allowed_model_types``, nemo-gym 0.7) a resources server of it accepts as the
    policy: empty when any will do."""
    several_agent_episodes: tuple[str, ...] = ()
    """Its typed environment servers (nemo-gym 0.7) that run no one agent's rollouts (``nemo_user_sim``), which
    verifiers-nemo does not drive (see ``_stack/plan.refuse_episode_servers``)."""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def model_servers(self) -> tuple[str, ...]:
        """Model server instances this config defines besides ``policy_model`` (judges and the like)."""
        return tuple(s.name for s in self.servers if s.kind == RESPONSES_API_MODELS and s.name != POLICY_MODEL)


@dataclass(frozen=True)
class GymEnvironment(_Needs):  # type: ignore[misc]  # judge_models/external_reasons are properties here
    """A packaged NeMo Gym environment (``resources_servers/<name>/``) and what it needs to run."""

    name: str
    root: Path
    directory: Path
    configs: tuple[GymConfig, ...]
    default_config: GymConfig | None
    server_requirements: tuple[str, ...]
    """Python requirements of ``resources_servers/<name>/`` beyond nemo-gym itself."""
    has_example_rollouts: bool
    """``data/example_rollouts.jsonl`` exists and its first row is a recording (response and reward)."""
    problems: tuple[str, ...] = ()
    """What the catalogue found odd while reading this environment (never fatal)."""
    broken: str | None = None
    """Why it cannot run as this nemo-gym release packages it (measured), if it cannot."""
    origin: Path | None = None
    """Where an environment of your own was found (its folder, or the config YAML named); None when packaged."""
    tree: GymTree | None = None
    """Where its servers' folders and data are searched (yours first, then the install); None when packaged."""
    kind: str = RESOURCES_SERVER
    """``environment`` (nemo-gym >= 0.7's ``environments/NAME``), ``benchmark`` (``benchmarks/NAME[/VARIANT]``) or
    ``resources server`` (a config under ``resources_servers/NAME/configs/``, on every release)."""
    benchmark: BenchmarkSpec | None = None
    """A benchmark's dataset as Gym runs it (prompt config, repeats, prepare script); None for other kinds."""
    description: str | None = None
    alias_of: str | None = None
    """Named by one of Gym's deprecated aliases: the name Gym now gives it."""
    reference: str | None = None
    """How to name it when its short name is another's (``resources_servers/NAME``); None: ``name`` or its path."""

    @property
    def local(self) -> bool:
        """An environment of your own (a folder outside the Gym install), not a packaged one."""
        return self.origin is not None

    @property
    def ref(self) -> str:
        """How to name this environment again, anywhere (``get_environment(env.ref)``): a packaged one by its
        name, one of yours by its absolute path."""
        if self.reference is not None:
            return self.reference
        if self.kind != RESOURCES_SERVER and self.origin is None:
            return self.name
        return str(self.origin) if self.origin is not None else self.name

    @property
    def source(self) -> str:
        """Where it comes from, in words: ``packaged`` or its folder."""
        return str(self.directory) if self.local else "packaged"

    @property
    def search(self) -> GymTree:
        return self.tree if self.tree is not None else GymTree(self.root)

    @property
    def agents(self) -> tuple[GymAgent, ...]:
        """Every agent instance any of the environment's configs define."""
        return tuple(a for c in self.configs for a in c.agents)

    @property
    def default_agent(self) -> GymAgent | None:
        """The default config's first agent whose resources server is this environment's."""
        if self.default_config is None or not self.default_config.agents:
            return None
        if self.benchmark is not None and self.benchmark.agent is not None:
            for candidate in self.default_config.agents:
                if candidate.name == self.benchmark.agent:
                    return candidate
        own = {s.name for s in self.default_config.servers if s.kind == RESOURCES_SERVERS and s.type == self.name}
        for candidate in self.default_config.agents:
            if candidate.resources_server in own:
                return candidate
        return self.default_config.agents[0]

    @property
    def datasets(self) -> tuple[GymDataset, ...]:
        """Every dataset any config names, the default config's first."""
        ordered = [c for c in self.configs if c is self.default_config]
        ordered += [c for c in self.configs if c is not self.default_config]
        return tuple(d for c in ordered for a in c.agents for d in a.datasets)

    @property
    def default_dataset(self) -> GymDataset | None:
        """What ``NeMoGymTaskset(nemo_env=name)`` loads.

        The first shipped dataset of type ``example`` (the default agent's, then the default config's,
        then other configs'), else the first shipped dataset of any type, else ``data/example.jsonl``
        under the default agent when no config names it.
        """
        candidates = list(self.datasets)
        default_agent = self.default_agent
        if default_agent is not None:
            candidates.sort(key=lambda d: d.agent != default_agent.name)  # stable: keeps config order
        for wanted in (lambda d: d.type == "example", lambda d: d.name == "example", lambda d: True):
            for dataset in candidates:
                if dataset.exists and wanted(dataset):
                    return dataset
        fallback = self.directory / "data" / "example.jsonl"
        if fallback.is_file() and default_agent is not None:
            return GymDataset(
                name="example",
                type="example",
                jsonl_fpath=f"{RESOURCES_SERVERS}/{self.name}/data/example.jsonl",
                path=fallback,
                exists=True,
                agent=default_agent.name,
                config=default_agent.config,
            )
        return None

    @property
    def example_rollouts_path(self) -> Path:
        return self.directory / EXAMPLE_ROLLOUTS

    @property
    def requirements(self) -> tuple[str, ...]:
        """Python requirements beyond nemo-gym to run the default config (servers and agents)."""
        if self.default_config is None:
            return self.server_requirements
        return self.default_config.requirements

    @property
    def judge_models(self) -> tuple[str, ...]:
        return self.default_config.judge_models if self.default_config else ()

    @property
    def external_reasons(self) -> tuple[str, ...]:
        return self.default_config.external_reasons if self.default_config else ()

    @property
    def runs_offline_with_nemo_gym_only(self) -> bool:
        """Runnable with nothing but nemo-gym: an agent, no extra packages, no judge, no external need."""
        return (
            self.default_agent is not None
            and self.broken is None
            and not self.requirements
            and not self.needs_judge
            and not self.needs_external
        )

    def agent(self, name: str) -> GymAgent:
        """The agent instance called ``name``, or a ConfigurationError listing the defined ones."""
        for candidate in self.agents:
            if candidate.name == name:
                return candidate
        names = [a.name for a in self.agents]
        raise ConfigurationError(
            f"NeMo Gym environment {self.name!r} defines no agent {name!r}{close_hint(name, names)}. "
            f"Its agents: {', '.join(names) or '(none)'}."
        )

    def dataset(self, name: str) -> GymDataset:
        """The dataset called ``name`` (default config first), else one whose type is ``name``."""
        everything = self.datasets
        for dataset in everything:
            if dataset.name == name:
                return dataset
        for dataset in everything:
            if dataset.type == name:
                return dataset
        names = sorted({d.name for d in everything})
        raise ConfigurationError(
            f"NeMo Gym environment {self.name!r} has no dataset {name!r}{close_hint(name, names)}. "
            f"Its configs name: {', '.join(names) or '(none)'}."
        )


def close_hint(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""

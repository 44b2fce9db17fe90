"""The catalogue of NeMo Gym environments packaged with nemo-gym.

Everything here is read from files under the Gym root (the directory holding ``nemo_gym/``,
``resources_servers/``, ``responses_api_agents/``...): config YAML, requirement files, the servers'
source text. ``nemo_gym`` itself is never imported, so the catalogue works from an interpreter
that does not have nemo-gym (the Gym runtime may be another interpreter).

An environment is a directory ``resources_servers/<name>/`` with ``configs/*.yaml``. Several
configs may exist; the *default config* is ``configs/<name>.yaml`` when present, else the first
config (by file name) that defines an agent, else the first config. The environment-level flags
(``needs_judge``, ``needs_external``, ``requirements``...) describe the default config; each
``GymConfig`` carries its own. How judge and external needs are decided lives in one function,
``classify_config``.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .._exceptions import ConfigurationError, UnknownEnvironmentError
from .._judge.config import judge_names
from .config import (
    INCLUDES,
    POLICY_MODEL,
    RESOURCES_SERVERS,
    RESPONSES_API_AGENTS,
    RESPONSES_API_MODELS,
    YAML_LOADER,
    config_strings,
    interpolations,
    load_config,
    requirements_beyond_nemo_gym,
    server_entries,
)
from .releases import installed_version, packaging_problem
from .runtime import gym_root
from .tree import PROJECT_FILES, GymTree, gym_roots_from_env, tree_of_configs

logger = logging.getLogger(__name__)

EXAMPLE_ROLLOUTS = "data/example_rollouts.jsonl"
"""Where an environment keeps its recorded rollouts, relative to its directory."""

# Config variables the harness's own Gym config defines (the policy entry points at our proxy).
_STACK_SUPPLIED = frozenset({"policy_base_url", "policy_api_key", "policy_model_name"})
# Resources-server flags that switch a configured judge model off.
# Variable or field names that hold a credential or the address of a service.
_ADDRESS_OR_SECRET = re.compile(r"api_?key|token$|secret|password|(^|_)url$|(^|_)host$|endpoint", re.IGNORECASE)
# A field annotated without a default on its own line: ``    google_api_key: str``.
_BARE_ANNOTATION = re.compile(r"^[ \t]+\w+[ \t]*:[ \t]*[^=\n]+$", re.MULTILINE)
_DATA_FILE = re.compile(r"[\w./-]+\.(?:jsonl|json|csv|parquet|db|sqlite)", re.IGNORECASE)
# What a server's or agent's entrypoint source shows when it needs more than the local machine.
_SOURCE_MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"^\s*(?:from|import)\s+[\w.]*?\b(setup_\w+)", re.MULTILINE),
        "installs software or fetches data when it starts (imports {0})",
    ),
    (
        re.compile(
            r"^\s*(?:from|import)\s+[\w.]*?(docker|apptainer|singularity)"
            r"|[\"'](docker|apptainer|singularity)[\"']"
            r"|\b(docker|apptainer|singularity)\s+(?:run|exec|build|pull)\b",
            re.IGNORECASE | re.MULTILINE,
        ),
        "runs containers ({0})",
    ),
    (re.compile(r"[\"'](npm)[\"']|\b(npm)\s+install\b"), "installs a command-line tool with {0}"),
    (
        re.compile(r"\b(git clone|snapshot_download|hf_hub_download|download_model|nltk\.download)\b"),
        "downloads at run time ({0})",
    ),
)


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

    @property
    def local(self) -> bool:
        """An environment of your own (a folder outside the Gym install), not a packaged one."""
        return self.origin is not None

    @property
    def ref(self) -> str:
        """How to name this environment again, anywhere (``get_environment(env.ref)``): a packaged one by its
        name, one of yours by its absolute path."""
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
            f"NeMo Gym environment {self.name!r} defines no agent {name!r}{_close_hint(name, names)}. "
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
            f"NeMo Gym environment {self.name!r} has no dataset {name!r}{_close_hint(name, names)}. "
            f"Its configs name: {', '.join(names) or '(none)'}."
        )


def classify_config(doc: Mapping[str, Any], root: Path | GymTree) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Decide what a config needs beyond Gym itself: ``(judge_models, external_reasons)``.

    This is the one place the rule lives. Only resources-server and agent definitions are inspected;
    a ``responses_api_models`` definition *is* a judge endpoint, so its keys and URLs count as the
    judge, not as an external service.

    Judge (read by ``_judge.config.judge_names``): a resources server calls a model while scoring when it

    * has a key ending in ``_model_server`` that refers to ``{type: responses_api_models, name: N}``
      (``N`` may be ``policy_model``: the policy then grades itself, which still needs a live model),
      unless it switches that off with ``should_use_judge``/``use_judge``/``enable_llm_judge: false``;
    * or has a ``judge_*`` key whose value interpolates a ``*_base_url`` (it calls that endpoint itself).

    External: the config needs something outside Gym and this machine when a resources server or agent

    1. interpolates a variable that names a credential or an address (``*api_key``, ``*_url``,
       ``*_host``, ``token``, ``secret``...), ``policy_base_url`` included (that server then calls the
       policy endpoint directly, not through Gym's model server), or a variable with no default that the
       harness does not supply;
    2. has a required config field (no default in the server's config class) naming a credential or an
       address that the config leaves unset (e.g. ``google_api_key``);
    3. has an entrypoint whose source installs software or fetches data when it starts (imports a
       ``setup_*`` module, the packaged convention for that), runs containers (imports docker,
       apptainer or singularity tooling, names one as a command, or runs ``docker run``...), installs
       with npm, or downloads at run time (``git clone``, ``snapshot_download``, ``nltk.download``...).
       Words in prose do not count ("instead of a Docker sandbox").

    4. (resources servers) names a relative data file (``.jsonl``, ``.json``, ``.csv``, ``.parquet``,
       ``.db``, ``.sqlite``; an interpolation's default included) that exists neither in the server's
       directory nor under the Gym root: it needs data that is not shipped.

    Rules 2 and 3 read source text (never import it); they are heuristics, and each hit says why in
    its reason string so a wrong call is easy to spot.
    """
    tree = root if isinstance(root, GymTree) else GymTree(root)
    judges = judge_names(doc)
    reasons: list[str] = []
    for entry_name, kind, type_name, definition in server_entries(doc):
        if kind == RESPONSES_API_MODELS:
            continue
        for path, text in config_strings(definition):
            for var, default in _parse_interpolations(text):
                if _ADDRESS_OR_SECRET.search(var):
                    if var in _STACK_SUPPLIED:
                        reasons.append(f"{entry_name}.{path} calls the policy endpoint directly (${{{var}}})")
                    else:
                        reasons.append(f"{entry_name}.{path} needs {var} (a credential or service address)")
                elif default is None and var not in _STACK_SUPPLIED:
                    reasons.append(f"{entry_name}.{path} needs a value for {var}")
        directory = tree.server_dir(kind, type_name)
        if kind == RESOURCES_SERVERS:
            for path, text in config_strings(definition):
                defaults = [d for _, d in _parse_interpolations(text) if d]
                for candidate in defaults or [text]:
                    if _is_missing_data_file(candidate, directory, tree):
                        reasons.append(f"{entry_name}.{path} needs data that is not shipped ({candidate})")
        entrypoint = directory / str(definition.get("entrypoint") or "app.py")
        for field_name in _required_secret_fields(entrypoint):
            if definition.get(field_name) is None:
                reasons.append(f"{entry_name} needs {field_name} (required by {type_name}, not set by the config)")
        for reason in _source_reasons(entrypoint):
            reasons.append(f"{entry_name} ({kind}/{type_name}) {reason}")
    return tuple(dict.fromkeys(judges)), tuple(dict.fromkeys(reasons))


def list_environments(root: str | Path | None = None, *, local: bool = True) -> list[GymEnvironment]:
    """Every NeMo Gym environment: those of your trees (``VERIFIERS_NEMO_GYM_ROOT``, ``--gym-root``, the working
    directory when it holds ``resources_servers/``) first, then the packaged ones under ``root`` (default: the Gym
    runtime's) that none of yours shadows by name; each group sorted by name."""
    resolved = _resolve_root(root)
    packaged = _load_catalogue(resolved)
    if not local:
        return list(packaged)
    yours = _local_catalogue(resolved)
    shadowed = {e.name for e in yours}
    return [*yours, *(e for e in packaged if e.name not in shadowed)]


def get_environment(name: str, root: str | Path | None = None) -> GymEnvironment:
    """The environment ``name`` names: a path (an environment folder in Gym's ``resources_servers/<name>``
    layout, or one of its config YAMLs), else a name in your trees (``VERIFIERS_NEMO_GYM_ROOT``, the working
    directory's ``resources_servers/``), else a packaged name; an UnknownEnvironmentError lists the closest."""
    resolved = _resolve_root(root)
    if is_path_reference(name):
        directory, config = locate_environment(name)
        return _local_environment(resolved, directory, config, gym_roots_from_env())
    for environment in _local_catalogue(resolved):
        if environment.name == name:
            return environment
    environments = _load_catalogue(resolved)
    for environment in environments:
        if environment.name == name:
            return environment
    names = [e.name for e in environments]
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    close += [n for n in names if name and name.lower() in n.lower() and n not in close][: 5 - len(close)]
    hint = f"Closest: {', '.join(close)}." if close else "No packaged name is close."
    raise UnknownEnvironmentError(
        f"Unknown NeMo Gym environment {name!r}. {hint} "
        f"`verifiers-nemo envs` lists all {len(names)} packaged in {resolved / RESOURCES_SERVERS}; an environment "
        "of your own is named by its folder's path (./resources_servers/NAME) or found by name under --gym-root DIR."
    )


def is_path_reference(name: str) -> bool:
    """Whether an environment name is a path (to a folder or a config YAML), not a packaged name."""
    return "/" in name or os.sep in name or name.startswith(("~", ".")) or name.endswith((".yaml", ".yml"))


def env_label(reference: str) -> str:
    """A short name for an environment reference: a packaged name as it is, a path by its folder's name (and the
    config's stem when it is not the folder's default), for folder names and progress lines."""
    if not is_path_reference(reference):
        return reference
    path = Path(reference.rstrip("/" + os.sep))
    if path.suffix in (".yaml", ".yml"):
        folder = path.parent.parent.name
        return folder if path.stem == folder else f"{folder}.{path.stem}"
    return path.name or reference


def canonical_reference(name: str) -> str:
    """How a run names an environment wherever it goes (a resume elsewhere, Ray workers, env servers): a path by
    its absolute form, a name found in your trees by its folder's absolute path, a packaged name as it is."""
    if is_path_reference(name):
        directory, config = locate_environment(name)
        return str(config or directory)
    for root in gym_roots_from_env():
        folder = root / RESOURCES_SERVERS / name
        if (folder / "configs").is_dir():
            return str(folder)
    return name


def locate_environment(reference: str | Path) -> tuple[Path, Path | None]:
    """``(environment folder, config YAML or None)`` of a path naming an environment of your own; a
    ConfigurationError naming the path and the fix when it is not one."""
    path = Path(reference).expanduser().resolve()
    if not path.exists():
        raise UnknownEnvironmentError(
            f"Environment path {reference!r} does not exist on this machine ({path}). Fix: name the folder of an "
            f"environment (Gym's layout: {RESOURCES_SERVERS}/NAME with configs/NAME.yaml and app.py) or one of its "
            "config YAMLs; on a cluster, the folder must be at this path on every node."
        )
    if path.is_file():
        if path.suffix not in (".yaml", ".yml") or path.parent.name != "configs":
            raise ConfigurationError(
                f"{path} is not an environment config. Fix: name the environment's folder, or a YAML under its "
                "configs/."
            )
        return path.parent.parent, path
    if (path / "configs").is_dir():
        return path, None
    if (path / RESOURCES_SERVERS).is_dir():
        raise ConfigurationError(
            f"{path} holds a tree of environments ({RESOURCES_SERVERS}/), not one. Fix: name one of them "
            f"({path / RESOURCES_SERVERS}/NAME), or pass --gym-root {path} (VERIFIERS_NEMO_GYM_ROOT) and its name."
        )
    raise ConfigurationError(
        f"{path} is not an environment folder: it has no configs/ folder. Fix: lay it out as Gym's guide does "
        f"({RESOURCES_SERVERS}/NAME/ with app.py, configs/NAME.yaml, data/example.jsonl, requirements.txt)."
    )


def find_agent(agent_name: str, root: str | Path | None = None) -> tuple[GymEnvironment, GymAgent]:
    """The environment and agent instance for an agent name (as rows' ``agent_ref.name`` give it)."""
    matches = [(e, a) for e in list_environments(root) for a in e.agents if a.name == agent_name]
    if not matches:
        raise ConfigurationError(
            f"No packaged NeMo Gym environment defines an agent called {agent_name!r}. "
            "Pass nemo_env= to say which environment the rows belong to."
        )
    return matches[0]


# --------------------------------------------------------------------------------------------
# Loading


_cache_lock = threading.Lock()


def _resolve_root(root: str | Path | None) -> Path:
    resolved = (gym_root() if root is None else Path(root).expanduser()).resolve()
    if not (resolved / RESOURCES_SERVERS).is_dir():
        raise ConfigurationError(
            f"{resolved} is not a NeMo Gym root: it has no {RESOURCES_SERVERS}/ directory. "
            "Pass the directory that holds nemo_gym/ and resources_servers/ (the site-packages of the "
            "interpreter with nemo-gym installed)."
        )
    return resolved


def _load_catalogue(root: Path) -> tuple[GymEnvironment, ...]:
    with _cache_lock:
        return _load_catalogue_cached(root)


@functools.lru_cache(maxsize=8)
def _load_catalogue_cached(root: Path) -> tuple[GymEnvironment, ...]:
    environments = []
    tree = GymTree(root)
    for directory in _environment_folders(root):
        environments.append(_load_environment(tree, directory))
    logger.debug("catalogued %d NeMo Gym environments under %s", len(environments), root)
    return tuple(environments)


def _environment_folders(root: Path) -> list[Path]:
    return [
        d
        for d in sorted((root / RESOURCES_SERVERS).iterdir())
        if d.is_dir() and (d / "configs").is_dir() and not d.name.startswith(("_", "."))
    ]


def _local_catalogue(install: Path) -> list[GymEnvironment]:
    """The environments of your trees, the first tree's first where names repeat."""
    roots = gym_roots_from_env()
    found: dict[str, GymEnvironment] = {}
    for root in roots:
        for directory in _environment_folders(root):
            if directory.name not in found:
                found[directory.name] = _local_environment(install, directory, None, roots)
    return [found[name] for name in sorted(found)]


def _local_environment(install: Path, directory: Path, config: Path | None, roots: tuple[Path, ...]) -> GymEnvironment:
    """An environment of yours, read again whenever its configs, requirements or recordings change."""
    return _local_environment_cached(install, directory, config, roots, _folder_signature(directory))


@functools.lru_cache(maxsize=64)
def _local_environment_cached(
    install: Path, directory: Path, config: Path | None, roots: tuple[Path, ...], _signature: tuple[Any, ...]
) -> GymEnvironment:
    tree = tree_of_configs([config or directory / "configs" / "_.yaml"], install, roots)
    if directory.parent.name != RESOURCES_SERVERS:  # a folder of its own: it stands for resources_servers/<name>
        tree = GymTree(install, tree.roots, ((f"{RESOURCES_SERVERS}/{directory.name}", directory),))
    return _load_environment(tree, directory, origin=config or directory, config=config)


def _folder_signature(directory: Path) -> tuple[Any, ...]:
    """What decides an environment's catalogue entry: its configs, requirement files and recordings, as stat."""
    paths = [*directory.glob("configs/*.y*ml"), *(directory / f for f in PROJECT_FILES)]
    paths += [directory / EXAMPLE_ROLLOUTS, *directory.glob("data/*.jsonl")]
    signature = []
    for path in sorted(paths):
        try:
            stat = path.stat()
        except OSError:
            continue
        signature.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(signature)


def _load_environment(
    tree: GymTree, directory: Path, origin: Path | None = None, config: Path | None = None
) -> GymEnvironment:
    root = tree.install
    name = directory.name
    problems: list[str] = []
    configs = tuple(_load_config(tree, path) for path in sorted(directory.glob("configs/*.y*ml")) if path.is_file())
    default = _pick_default_config(name, configs)
    if config is not None:
        default = next((c for c in configs if c.path == config), default)
    if not configs:
        problems.append("no config YAML under configs/")
    elif not any(c.agents for c in configs):
        problems.append("no config defines an agent (it cannot run on its own)")
    server_requirements, requirement_problems = requirements_beyond_nemo_gym(directory)
    problems += requirement_problems
    for config in configs:
        problems += [f"{config.name}: {p}" for p in config.problems]
    has_rollouts, rollout_problem = _peek_recordings(directory / EXAMPLE_ROLLOUTS)
    if rollout_problem:
        problems.append(rollout_problem)
    return GymEnvironment(
        name=name,
        root=root,
        directory=directory,
        configs=configs,
        default_config=default,
        server_requirements=server_requirements,
        has_example_rollouts=has_rollouts,
        problems=tuple(problems),
        broken=(None if origin else packaging_problem(installed_version(root), name)) or _adapter_restriction(default),
        origin=origin,
        tree=tree if origin is not None else None,
    )


def _adapter_restriction(config: GymConfig | None) -> str | None:
    """Why a config whose resources server accepts only some of Gym's own model servers as the policy cannot run
    here: Gym refuses any other policy at start, and verifiers-nemo's routing proxy is the policy."""
    if config is None or not config.model_adapters:
        return None
    return (
        "its resources server accepts only Gym's own model servers as the policy "
        f"({', '.join(config.model_adapters)}): its inputs ride in the request in a form only they translate for "
        "the model (e.g. audio in metadata), and verifiers-nemo's routing proxy, which stands in for the policy, "
        "does not; Gym refuses the stack at start"
    )


def _pick_default_config(name: str, configs: tuple[GymConfig, ...]) -> GymConfig | None:
    for config in configs:
        if config.path.stem == name:
            return config
    for config in configs:
        if config.agents:
            return config
    return configs[0] if configs else None


def _load_config(tree: GymTree, path: Path) -> GymConfig:
    root = tree.install
    relpath = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    problems: list[str] = []
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=YAML_LOADER)  # a safe loader (C or pure Python)
        if isinstance(doc, Mapping) and INCLUDES in doc:
            doc = load_config(path)  # with the configs it pulls in (its own config_paths), as nemo-gym reads it
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return GymConfig(path, relpath, (), (), (), (), (), (f"cannot be read as YAML: {exc}",))
    if not isinstance(doc, Mapping):
        doc = {}
        problems.append("is not a mapping of server entries")

    servers: list[GymServer] = []
    agents: list[GymAgent] = []
    requirements: list[str] = []
    adapters: list[str] = []
    seen_types: set[tuple[str, str]] = set()
    for entry_name, kind, type_name, definition in server_entries(doc):
        servers.append(GymServer(entry_name, kind, type_name))
        if kind == RESOURCES_SERVERS:
            allowed = definition.get("allowed_model_types")
            adapters += [allowed] if isinstance(allowed, str) else [str(a) for a in allowed or () if a]
        if kind != RESPONSES_API_MODELS and (kind, type_name) not in seen_types:
            seen_types.add((kind, type_name))
            directory = tree.server_dir(kind, type_name)
            if not directory.is_dir():
                problems.append(f"{entry_name} uses {kind}/{type_name}, which is not packaged")
            elif tree.is_local(directory) and not any((directory / f).is_file() for f in PROJECT_FILES):
                problems.append(
                    f"{entry_name}: {directory} has no requirements.txt (nor pyproject.toml); Gym starts a server "
                    "from your folder only when it has one: add it (empty when nemo-gym is all it needs)"
                )
            else:
                found, requirement_problems = requirements_beyond_nemo_gym(directory)
                requirements += found
                problems += requirement_problems
        if kind == RESPONSES_API_AGENTS:
            agents.append(_load_agent(tree, path, entry_name, type_name, definition, problems))

    defined_models = {s.name for s in servers if s.kind == RESPONSES_API_MODELS} | {POLICY_MODEL}
    judges, reasons = classify_config(doc, tree)
    for judge in judges:
        if judge == "???":
            problems.append("its judge model server is left for the user to set (???)")
        elif not judge.startswith("${") and judge not in defined_models:
            problems.append(f"refers to model server {judge!r}, which it does not define (merge a config that does)")
    return GymConfig(
        path=path,
        relpath=relpath,
        servers=tuple(servers),
        agents=tuple(agents),
        judge_models=judges,
        external_reasons=reasons,
        requirements=tuple(dict.fromkeys(requirements)),
        problems=tuple(problems),
        model_adapters=tuple(dict.fromkeys(adapters)),
    )


def _load_agent(
    tree: GymTree, config: Path, name: str, type_name: str, definition: Mapping[str, Any], problems: list[str]
) -> GymAgent:
    datasets: list[GymDataset] = []
    raw_datasets = definition.get("datasets") or []
    if not isinstance(raw_datasets, list):
        problems.append(f"{name}.datasets is not a list")
        raw_datasets = []
    for index, raw in enumerate(raw_datasets):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("jsonl_fpath"), str):
            problems.append(f"{name}.datasets[{index}] has no jsonl_fpath")
            continue
        fpath = raw["jsonl_fpath"]
        full = tree.find(fpath)
        datasets.append(
            GymDataset(
                name=str(raw.get("name") or Path(fpath).stem),
                type=str(raw["type"]) if raw.get("type") is not None else None,
                jsonl_fpath=fpath,
                path=full,
                exists=full.is_file(),
                agent=name,
                config=config,
                source=_dataset_source(raw),
                prompt_config=str(raw["prompt_config"]) if raw.get("prompt_config") else None,
            )
        )
    max_steps = definition.get("max_steps")
    agent_requirements: tuple[str, ...] = ()
    agent_dir = tree.server_dir(RESPONSES_API_AGENTS, type_name)
    if agent_dir.is_dir():
        agent_requirements, _ = requirements_beyond_nemo_gym(agent_dir)
    return GymAgent(
        name=name,
        type=type_name,
        config=config,
        resources_server=_ref_name(definition.get("resources_server")),
        model_server=_ref_name(definition.get("model_server")),
        datasets=tuple(datasets),
        max_steps=max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) else None,
        requirements=agent_requirements,
    )


def _ref_name(ref: Any) -> str | None:
    if isinstance(ref, Mapping) and ref.get("name") is not None:
        return str(ref["name"])
    return None


def _dataset_source(raw: Mapping[str, Any]) -> str | None:
    for key, label in (
        ("source", None),
        ("huggingface_identifier", "huggingface"),
        ("gitlab_identifier", "gitlab"),
    ):
        value = raw.get(key)
        if not isinstance(value, Mapping):
            continue
        kind = label or str(value.get("type") or "unknown")
        where = value.get("repo_id") or value.get("dataset_name") or ""
        artifact = value.get("artifact_fpath")
        return f"{kind}:{where}" + (f" ({artifact})" if artifact else "")
    return None


def _parse_interpolations(text: str) -> Iterator[tuple[str, str | None]]:
    """``(variable, default or None)`` of each plain, ``oc.env`` or ``oc.select`` ``${...}`` in ``text``."""
    for resolver, var, default in interpolations(text):
        if resolver in ("", "oc.env", "oc.select"):
            yield var, default


def _is_missing_data_file(value: str, directory: Path, tree: GymTree) -> bool:
    if not _DATA_FILE.fullmatch(value.strip()):
        return False
    relative = Path(value.strip())
    return not relative.is_absolute() and not (directory / relative).exists() and not tree.find(relative).exists()


def _peek_recordings(path: Path) -> tuple[bool, str | None]:
    """Whether a recordings file's first row holds a recorded ``response`` and ``reward``."""
    if not path.is_file():
        return False, None
    try:
        with path.open("rb") as handle:
            first = next((line for line in handle if line.strip()), b"")
    except OSError as exc:
        return False, f"{EXAMPLE_ROLLOUTS}: cannot be read ({exc})"
    try:
        row = json.loads(first)
    except ValueError:
        return False, f"{EXAMPLE_ROLLOUTS}: not JSON lines, placeholder rows?"
    if (
        isinstance(row, dict)
        and "response" not in row
        and ("gym_result" in row or "trace" in row)
        and "completion" in row
    ):
        return row.get("reward") is not None, None  # a run of ours saved with --save-trace (``as_recording``)
    if not isinstance(row, dict) or "response" not in row or "reward" not in row:
        return False, f"{EXAMPLE_ROLLOUTS}: no recordings, its rows have no response and reward"
    return True, None


def _source_text(path: Path) -> str:
    try:
        stat = path.stat()
    except OSError:
        return ""
    return _read_source(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=512)
def _read_source(path: Path, _mtime_ns: int, _size: int) -> str:
    """Source text, cached per file version (many configs share one agent implementation)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _source_reasons(entrypoint: Path) -> tuple[str, ...]:
    return _reasons_of(_source_text(entrypoint))


@functools.lru_cache(maxsize=512)
def _reasons_of(text: str) -> tuple[str, ...]:
    reasons = []
    for pattern, reason in _SOURCE_MARKERS:
        match = pattern.search(text)
        if match:
            reasons.append(reason.format(next(group for group in match.groups() if group).lower()))
    return tuple(reasons)


def _required_secret_fields(entrypoint: Path) -> tuple[str, ...]:
    return _secret_fields_of(_source_text(entrypoint))


@functools.lru_cache(maxsize=512)
def _secret_fields_of(text: str) -> tuple[str, ...]:
    """Fields without a default, named like a credential or address, of the source's config classes."""
    if not any(_ADDRESS_OR_SECRET.search(m.group().split(":")[0].strip()) for m in _BARE_ANNOTATION.finditer(text)):
        return ()  # cheap pre-check: parsing every entrypoint costs about a second
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    fields = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [
            b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases
        ]
        if not any(base.endswith("Config") for base in bases):
            continue
        for statement in node.body:
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and statement.value is None
                and _ADDRESS_OR_SECRET.search(statement.target.id)
            ):
                fields.append(statement.target.id)
    return tuple(dict.fromkeys(fields))


def _close_hint(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""

"""Reading NeMo Gym server configs without importing nemo_gym: the one reader of their YAML.

A Gym config YAML maps instance names to ``{server_type: {implementation: {entrypoint, ...}}}``;
a reference to another server is ``{type: <server_type>, name: <instance>}``. ``server_entries`` walks
that shape (the catalogue reads every entry); ``server_instances`` keeps the launchable ones (the
stack); ``requirements_beyond_nemo_gym`` says what a server's directory asks for.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RESOURCES_SERVERS = "resources_servers"
RESPONSES_API_AGENTS = "responses_api_agents"
RESPONSES_API_MODELS = "responses_api_models"
ENVIRONMENT_SERVERS = "environment_servers"
LEGACY_AGENT_RELAY = "legacy_agent"
FLAT_RUN_SERVERS = frozenset({LEGACY_AGENT_RELAY, "single_agent_turn_legacy"})
"""nemo-gym 0.7's environment servers that take a row at ``/run`` and answer a Gym result, as an agent does:
``legacy_agent`` relays it to its agent; ``single_agent_turn_legacy`` seeds the resources server and the agent's
session, runs one agent turn and verifies (a failure comes back as ``_ng_failure_*`` fields)."""
"""nemo-gym >= 0.7: servers in front of an agent (``legacy_agent`` relays ``/run`` to the one it names)."""
SERVER_TYPES = (RESOURCES_SERVERS, RESPONSES_API_AGENTS, RESPONSES_API_MODELS, ENVIRONMENT_SERVERS)
POLICY_MODEL = "policy_model"
"""The model server name Gym configs use for the policy being trained or evaluated."""
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available, same semantics


@dataclass(frozen=True)
class ServerInstance:
    """One server entry of a Gym config."""

    name: str
    """The instance name (top-level key), e.g. ``example_multi_step_simple_agent``."""
    server_type: str
    """``resources_servers``, ``responses_api_agents``, ``responses_api_models`` or ``environment_servers``."""
    implementation: str
    """The server's directory name under its type, e.g. ``simple_agent``."""
    config: dict[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def rel_dir(self) -> Path:
        return Path(self.server_type, self.implementation)

    @property
    def override_prefix(self) -> str:
        """The dotted path of this instance's settings, for ``++key=value`` overrides."""
        return f"{self.name}.{self.server_type}.{self.implementation}"

    def relays_run_of(self, agent: str) -> bool:
        """Whether this is an environment server that takes ``agent``'s rows at its own ``/run`` (``FLAT_RUN_SERVERS``:
        Gym's own collector posts rollouts there, not to the agent)."""
        ref = self.config.get("agent_server")
        return (
            self.server_type == ENVIRONMENT_SERVERS
            and self.implementation in FLAT_RUN_SERVERS
            and isinstance(ref, dict)
            and ref.get("name") == agent
        )

    def takes_episodes_of(self, agent: str) -> bool:
        """Whether this is a typed environment server that runs ``agent``'s rollouts as episodes (nemo-gym 0.7's
        ``single_agent_turn``: ``/run`` takes an episode request, see ``_stack/episodes.py``)."""
        ref = self.config.get("agent_server")
        return (
            self.server_type == ENVIRONMENT_SERVERS
            and self.implementation not in FLAT_RUN_SERVERS
            and isinstance(ref, dict)
            and ref.get("name") == agent
        )

    @property
    def episode_taskset(self) -> str:
        """The taskset a typed environment server's episodes name: its resources server's (as Gym's
        ``single_agent_turn_legacy`` names a flat row's task), else its own name."""
        ref = self.config.get("resources_server")
        return str(ref["name"]) if isinstance(ref, dict) and ref.get("name") else self.name

    def references(self) -> list[tuple[str, str]]:
        """Other servers this one refers to, as ``(server_type, instance_name)``."""
        refs = []
        for value in self.config.values():
            if isinstance(value, dict) and set(value) >= {"type", "name"} and value["type"] in SERVER_TYPES:
                refs.append((value["type"], value["name"]))
        return refs


def load_yaml(path: Path) -> dict[str, Any]:
    with open(path) as f:
        data = yaml.load(f, Loader=YAML_LOADER)  # a safe loader (C or pure Python)
    return data if isinstance(data, dict) else {}


INCLUDES = "config_paths"
"""A config's own list of configs it pulls in (nemo-gym merges each before the config that names it)."""


def load_config(path: Path, _seen: frozenset[Path] = frozenset()) -> dict[str, Any]:
    """A Gym config file with the configs it pulls in (its ``config_paths``, as nemo-gym reads them: each included
    config first, the including file's own entries merged over them; an include is a path relative to the Gym root,
    found from the including file's folder upwards)."""
    doc = load_yaml(path)
    includes = doc.pop(INCLUDES, None)
    if not isinstance(includes, list) or not includes:
        return doc
    merged: dict[str, Any] = {}
    seen = _seen | {path.resolve()}
    for include in includes:
        found = _find_include(path, str(include))
        if found is not None and found.resolve() not in seen:
            merged = _deep_merge(merged, load_config(found, seen))
    return _deep_merge(merged, doc)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged onto ``base``, mappings key by key (as OmegaConf merges configs)."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _find_include(path: Path, include: str) -> Path | None:
    if Path(include).is_absolute():
        return Path(include) if Path(include).is_file() else None
    for folder in path.resolve().parents:
        if (folder / include).is_file():
            return folder / include
    return None


def server_entries(doc: Mapping[str, Any]) -> Iterator[tuple[str, str, str, Mapping[str, Any]]]:
    """``(entry name, server type, implementation, definition)`` for each server entry of a config:
    ``name: {server_type: {implementation: {...}}}`` (a definition that is not a mapping reads as ``{}``)."""
    for entry_name, value in doc.items():
        if not isinstance(value, Mapping) or len(value) != 1:
            continue
        server_type, inner = next(iter(value.items()))
        if server_type not in SERVER_TYPES or not isinstance(inner, Mapping):
            continue
        for implementation, definition in inner.items():
            yield (
                str(entry_name),
                str(server_type),
                str(implementation),
                definition if isinstance(definition, Mapping) else {},
            )


def server_instances(config: Mapping[str, Any]) -> list[ServerInstance]:
    """The launchable server entries: one implementation each, with an ``entrypoint``."""
    entries = list(server_entries(config))
    implementations = Counter(name for name, *_ in entries)
    return [
        ServerInstance(name, server_type, implementation, dict(definition))
        for name, server_type, implementation, definition in entries
        if implementations[name] == 1 and "entrypoint" in definition
    ]


def config_strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted path, text)`` of every string inside a config value."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from config_strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from config_strings(item, f"{path}[{index}]")


_INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")


def interpolations(text: str) -> Iterator[tuple[str, str, str | None]]:
    """``(resolver, variable, default or None)`` of each OmegaConf ``${...}`` in ``text``: ``("oc.env", "VAR",
    "x")`` for ``${oc.env:VAR,x}``, ``("", "name", None)`` for a plain ``${name}``."""
    for body in _INTERPOLATION.findall(text):
        body = body.strip()
        resolver, colon, args = body.partition(":")
        if not colon:
            yield "", body, None
            continue
        var, comma, default = args.partition(",")
        yield resolver.strip(), var.strip(), (default.strip() if comma else None)


INHERIT_FROM = "_inherit_from"
"""nemo-gym's directive: ``target: {_inherit_from: source, ...}`` is ``source``'s entry with the target's keys merged
over it, and ``source`` is moved there (it is no entry of its own any more)."""
COPY_FROM = "_copy"
"""The same, leaving ``source`` where it is."""


def merged_configs(paths: list[Path]) -> dict[str, Any]:
    """Top-level merge of several config files (later files win per instance), then nemo-gym's top-level
    ``_inherit_from`` / ``_copy`` entries resolved (``resolve_inheritance``)."""
    merged: dict[str, Any] = {}
    for path in paths:
        merged.update(load_config(path))
    return resolve_inheritance(merged)


def resolve_inheritance(config: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level entries that inherit (``_inherit_from``) or copy (``_copy``) another top-level entry, as nemo-gym
    resolves them: the source's definition with the entry's own keys merged over it; an inherited source is no entry
    of its own afterwards (Gym moves it), a copied one stays. A source that is no top-level entry is left as it is
    (Gym's own parser says what is wrong with it)."""
    resolved = dict(config)
    moved: set[str] = set()
    for name, value in config.items():
        if not isinstance(value, Mapping):
            continue
        for key in (INHERIT_FROM, COPY_FROM):
            source = value.get(key)
            if isinstance(source, str) and isinstance(config.get(source), Mapping) and source != name:
                own = {k: v for k, v in value.items() if k != key}
                resolved[name] = _deep_merge(config[source], own)
                if key == INHERIT_FROM:
                    moved.add(source)
                break
    for source in moved:
        resolved.pop(source, None)
    return resolved


def requirements_beyond_nemo_gym(directory: Path) -> tuple[tuple[str, ...], list[str]]:
    """What a server directory's ``requirements.txt`` / ``pyproject.toml`` asks for beyond nemo-gym itself,
    and any problem reading them."""
    found: list[str] = []
    problems: list[str] = []
    txt = directory / "requirements.txt"
    if txt.is_file():
        try:
            lines = txt.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{txt.name} cannot be read: {exc}")
            lines = []
        for line in lines:
            requirement = line.split(" #", 1)[0].strip()
            if not requirement or requirement.startswith("#"):
                continue
            if requirement.startswith("-e ") or requirement.startswith("--editable "):
                requirement = requirement.split(None, 1)[1].strip()
            elif requirement.startswith("-"):
                continue  # pip options (--extra-index-url...): not a package
            found += _beyond_nemo_gym(requirement)
    pyproject = directory / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            problems.append(f"{pyproject.name} cannot be read: {exc}")
            project = {}
        for requirement in project.get("dependencies", []) if isinstance(project, Mapping) else []:
            found += _beyond_nemo_gym(str(requirement))
    return tuple(dict.fromkeys(found)), problems


_NEMO_GYM_REQUIREMENT = re.compile(r"^nemo[-_]gym\s*(?:\[([^\]]*)\])?", re.IGNORECASE)


def _beyond_nemo_gym(requirement: str) -> list[str]:
    """``[]`` for the line that installs nemo-gym itself (``nemo-gym[dev] @ ../../``, ``../..``).

    Extras other than ``dev`` do add packages, so ``nemo-gym[dev,sandbox]`` gives ``nemo-gym[sandbox]``.
    """
    if re.fullmatch(r"(\.\./)*\.\.(/)?", requirement):
        return []
    match = _NEMO_GYM_REQUIREMENT.match(requirement)
    if not match:
        return [requirement]
    extras = [e.strip() for e in (match.group(1) or "").split(",") if e.strip() and e.strip() != "dev"]
    return [f"nemo-gym[{','.join(extras)}]"] if extras else []

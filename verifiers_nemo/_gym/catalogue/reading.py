"""Reading an environment folder (its config YAML, requirement files, recordings) into catalogue entries."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from ..config import (
    ENVIRONMENT_SERVERS,
    FLAT_RUN_SERVERS,
    INCLUDES,
    POLICY_MODEL,
    RESOURCES_SERVERS,
    RESPONSES_API_AGENTS,
    RESPONSES_API_MODELS,
    YAML_LOADER,
    load_config,
    requirements_beyond_nemo_gym,
    server_entries,
)
from ..releases import installed_version, packaging_problem
from ..tree import PROJECT_FILES, GymTree
from .entries import EXAMPLE_ROLLOUTS, GymAgent, GymConfig, GymDataset, GymEnvironment, GymServer
from .gym_listing import ListedEntry
from .needs import classify_config


def environment_folders(root: Path) -> list[Path]:
    """The resources-server folders (``resources_servers/NAME/`` with ``configs/``) of a tree."""
    if not (root / RESOURCES_SERVERS).is_dir():
        return []
    return [
        d
        for d in sorted((root / RESOURCES_SERVERS).iterdir())
        if d.is_dir() and (d / "configs").is_dir() and not d.name.startswith(("_", "."))
    ]


def folder_signature(directory: Path) -> tuple[Any, ...]:
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


def read_environment(
    tree: GymTree, directory: Path, origin: Path | None = None, config: Path | None = None
) -> GymEnvironment:
    root = tree.install
    name = directory.name
    problems: list[str] = []
    configs = tuple(read_config(tree, path) for path in sorted(directory.glob("configs/*.y*ml")) if path.is_file())
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
    has_rollouts, rollout_problem = peek_recordings(directory / EXAMPLE_ROLLOUTS)
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
    if config is not None and config.several_agent_episodes:
        return (
            f"its typed environment server {', '.join(config.several_agent_episodes)} runs no one agent's rollouts "
            "(several agents and model servers), which verifiers-nemo does not drive; Gym's `gym eval run` does"
        )
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


def read_config(tree: GymTree, path: Path) -> GymConfig:
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
    several_agent_episodes: list[str] = []
    for entry_name, kind, type_name, definition in server_entries(doc):
        servers.append(GymServer(entry_name, kind, type_name))
        fronts_one_agent = isinstance(definition.get("agent_server"), Mapping)
        if kind == ENVIRONMENT_SERVERS and type_name not in FLAT_RUN_SERVERS and not fronts_one_agent:
            several_agent_episodes.append(f"{entry_name} (environment_servers/{type_name})")
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
            agents.append(read_agent(tree, path, entry_name, type_name, definition, problems))

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
        several_agent_episodes=tuple(several_agent_episodes),
    )


def read_agent(
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


def peek_recordings(path: Path) -> tuple[bool, str | None]:
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


def read_listed(tree: GymTree, entry: ListedEntry, flat_dir: Path, alias_of: str | None = None) -> GymEnvironment:
    """An environment or benchmark of Gym's catalogue: its config as Gym resolved it, written once as a flat config
    (``flat_dir``) that the stack starts from and this catalogue reads like any other."""
    problems: list[str] = []
    if entry.servers is not None:
        flat = flat_dir / f"{entry.kind}-{entry.name.replace('/', '--')}.yaml"
        text = yaml.safe_dump(entry.servers, sort_keys=False)
        if not flat.is_file() or flat.read_text(encoding="utf-8") != text:
            flat_dir.mkdir(parents=True, exist_ok=True)
            partial = flat.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, flat)
        config = read_config(tree, flat)
    else:  # Gym could not resolve it alone (a judge or a value left to the user): read as written
        config = read_config(tree, entry.config_path)
        problems.append(f"nemo-gym cannot resolve its config on its own ({entry.error})")
    config = replace(config, relpath=_relative(entry.config_path, tree.install))
    problems += list(config.problems)
    has_rollouts, rollout_problem = peek_recordings(entry.folder / EXAMPLE_ROLLOUTS)
    if rollout_problem and entry.kind != "benchmark":
        problems.append(rollout_problem)
    local = not entry.folder.resolve().is_relative_to(tree.install.resolve())
    return GymEnvironment(
        name=entry.name,
        root=tree.install,
        directory=entry.folder,
        configs=(config,),
        default_config=config,
        server_requirements=(),
        has_example_rollouts=has_rollouts,
        problems=tuple(problems),
        broken=(None if local else packaging_problem(installed_version(tree.install), entry.name))
        or _adapter_restriction(config),
        origin=entry.folder if local else None,
        tree=tree if local or tree.roots else None,
        kind=entry.kind,
        benchmark=entry.benchmark,
        description=entry.description,
        alias_of=alias_of,
    )


def _relative(path: Path, root: Path) -> str:
    resolved = path.resolve()
    return resolved.relative_to(root.resolve()).as_posix() if resolved.is_relative_to(root.resolve()) else str(path)

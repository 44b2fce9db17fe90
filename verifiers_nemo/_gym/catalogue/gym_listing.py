"""Gym's own catalogue of environments and benchmarks (nemo-gym >= 0.7), asked of the Gym runtime and cached.

nemo-gym 0.7 ships, beside ``resources_servers/``, ``environments/NAME/`` (a config composing a resources server, an
agent and an environment server) and ``benchmarks/NAME[/VARIANT]/`` (a config with one ``type: benchmark`` dataset).
Which names exist, which config each selects, and what those configs resolve to (``config_paths`` and
``_inherit_from``) is Gym's to say: ``_gym_side/catalogue_probe.py`` runs ``nemo_gym.registry``'s discovery and
Gym's config parser in the runtime's interpreter. Its answer is cached on disk by what decides it (the runtime, the
roots searched, every config file's size and time), so only the first listing after a change pays for it (~30 s on
a 2-core machine for 0.7.0's 232 entries).

A runtime without ``nemo_gym/registry.py`` (0.4) has no such catalogue: ``gym_listing`` returns None there and the
catalogue is the resources servers alone, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._exceptions import GymRuntimeError

logger = logging.getLogger(__name__)

ENVIRONMENTS = "environments"
BENCHMARKS = "benchmarks"
ENVIRONMENT = "environment"
BENCHMARK = "benchmark"
RESOURCES_SERVER = "resources server"
KINDS = (ENVIRONMENT, BENCHMARK, RESOURCES_SERVER)
"""What a catalogue name can be, in the order Gym's combined catalogue lets them claim a short name."""
EXTRA_ROOTS_VAR = "NEMO_GYM_EXTRA_ROOTS"
"""Gym's own variable for roots searched before the install (its ``--search-dir``)."""
_PROBE = Path(__file__).resolve().parents[2] / "_gym_side" / "catalogue_probe.py"
_PROBE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class BenchmarkSpec:
    """A benchmark's dataset as Gym runs it (``gym eval run --benchmark NAME``)."""

    dataset: str
    agent: str | None
    num_repeats: int
    """Gym's default rollouts per row for this benchmark."""
    jsonl_fpath: str
    """Where Gym's prepare script writes the benchmark's rows, relative to a Gym root."""
    prompt_config: str | None
    """The prompt template (YAML ``user`` + ``system``) Gym applies to each raw row."""
    prepare_script: str | None


@dataclass(frozen=True)
class ListedEntry:
    """One environment or benchmark of Gym's catalogue, its config resolved by Gym."""

    name: str
    kind: str
    config_path: Path
    folder: Path
    description: str | None
    domain: str | None
    servers: dict[str, Any] | None
    """The resolved config's server entries (ports Gym assigned while parsing left out); None when Gym could not
    resolve it alone (``error`` says why: a judge or value the user supplies, usually)."""
    error: str | None
    benchmark: BenchmarkSpec | None


@dataclass(frozen=True)
class GymListing:
    """Gym's catalogue of one runtime and set of roots: entries by name, and the deprecated aliases."""

    entries: tuple[ListedEntry, ...]
    aliases: dict[str, str]

    def named(self, name: str) -> list[ListedEntry]:
        return [e for e in self.entries if e.name == name]


def has_gym_catalogue(root: Path) -> bool:
    """Whether the nemo-gym at ``root`` has Gym's combined catalogue (0.7's ``discover_environment_catalog``)."""
    try:
        registry = (root / "nemo_gym" / "registry.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "def discover_environment_catalog" in registry


def runtime_python(root: Path) -> Path | None:
    """The interpreter whose site-packages is ``root`` (this one's, or a venv's ``bin/python``), if any."""
    resolved = root.resolve()
    for entry in sys.path:
        if entry and Path(entry).resolve() == resolved:
            return Path(sys.executable)
    for prefix in resolved.parents[:4]:
        for candidate in (prefix / "bin" / "python", prefix / "bin" / "python3"):
            if candidate.is_file() and (prefix / "pyvenv.cfg").is_file():
                return candidate
    return None


def gym_listing(root: Path, roots: tuple[Path, ...], cache: Path) -> GymListing | None:
    """Gym's catalogue for the runtime at ``root`` with ``roots`` searched first (None on a release without one)."""
    if not has_gym_catalogue(root):
        return None
    python = runtime_python(root)
    if python is None:
        logger.debug("no interpreter found for the Gym root %s: its environments and benchmarks are not listed", root)
        return None
    searched = tuple(r for r in roots if (r / ENVIRONMENTS).is_dir() or (r / BENCHMARKS).is_dir())
    key = _cache_key(python, root, searched)
    if key in _LISTINGS:
        return _LISTINGS[key]
    cached = cache / "gym-catalogue" / f"{key}.json"
    try:
        listing = _parse(json.loads(cached.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        document = _probe(python, searched, cache)
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cached.parent, delete=False, suffix=".tmp", encoding="utf-8") as out:
            json.dump(document, out)
        os.replace(out.name, cached)
        listing = _parse(document)
    _LISTINGS[key] = listing
    return listing


_LISTINGS: dict[str, GymListing] = {}
"""One listing per cache key in a process (a changed config file makes a new key)."""


def _probe(python: Path, roots: tuple[Path, ...], cache: Path) -> dict[str, Any]:
    neutral = cache / "gym-catalogue" / "cwd"  # Gym also searches the working directory: give it an empty one
    neutral.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env[EXTRA_ROOTS_VAR] = os.pathsep.join(str(r) for r in roots)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    logger.info("Reading nemo-gym's catalogue of environments and benchmarks (first listing only, cached after)…")
    with tempfile.TemporaryDirectory(dir=neutral) as scratch:
        out = Path(scratch) / "catalogue.json"
        try:
            done = subprocess.run(
                [str(python), str(_PROBE), str(out)],
                cwd=neutral,
                env=env,
                capture_output=True,
                text=True,
                timeout=_PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise GymRuntimeError(
                f"Reading nemo-gym's catalogue with {python} took over {_PROBE_TIMEOUT_S:.0f} s."
            ) from exc
        if done.returncode != 0 or not out.is_file():
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise GymRuntimeError(f"Reading nemo-gym's catalogue with {python} failed:\n{tail}")
        return json.loads(out.read_text(encoding="utf-8"))


def _cache_key(python: Path, root: Path, roots: tuple[Path, ...]) -> str:
    """What decides the listing: the probe, the runtime, the roots and every config file under their trees."""
    digest = hashlib.sha256()
    digest.update(_PROBE.read_bytes())
    digest.update(f"{python}\0{root.resolve()}\0".encode())
    for tree in (*roots, root):
        digest.update(f"{tree}\0".encode())
        for sub in (ENVIRONMENTS, BENCHMARKS, "resources_servers"):
            base = tree / sub
            if not base.is_dir():
                continue
            pattern = "*/configs/*.yaml" if sub == "resources_servers" else "**/*.yaml"
            for path in sorted(base.glob(pattern)):
                try:
                    stat = path.stat()
                except OSError:
                    continue
                digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:20]


def _parse(document: dict[str, Any]) -> GymListing:
    entries = []
    for raw in document["entries"]:
        servers = raw.get("servers")
        entries.append(
            ListedEntry(
                name=str(raw["name"]),
                kind=str(raw["kind"]),
                config_path=Path(raw["config_path"]),
                folder=Path(raw["folder"]),
                description=raw.get("description"),
                domain=raw.get("domain"),
                servers=_without_addresses(servers) if isinstance(servers, dict) else None,
                error=raw.get("error"),
                benchmark=_benchmark_of(servers) if raw["kind"] == BENCHMARK and isinstance(servers, dict) else None,
            )
        )
    return GymListing(tuple(entries), {str(k): str(v) for k, v in (document.get("aliases") or {}).items()})


def _without_addresses(servers: dict[str, Any]) -> dict[str, Any]:
    """Server entries less the ``host``/``port`` Gym's parser filled in (each stack assigns its own) and less
    ``policy_model`` (the parser's stand-in; the stack's is the routing proxy)."""
    kept = {}
    for name, value in servers.items():
        if name == "policy_model":
            continue
        ((server_type, inner),) = value.items()
        kept[name] = {
            server_type: {
                impl: {k: v for k, v in (body or {}).items() if k not in ("host", "port")}
                for impl, body in inner.items()
            }
        }
    return kept


def _benchmark_of(servers: dict[str, Any]) -> BenchmarkSpec | None:
    """The one ``type: benchmark`` dataset of a resolved benchmark config, with the agent that lists it."""
    for name, value in servers.items():
        ((server_type, inner),) = value.items()
        if server_type != "responses_api_agents":
            continue
        for body in inner.values():
            for dataset in (body or {}).get("datasets") or []:
                if isinstance(dataset, dict) and dataset.get("type") == BENCHMARK:
                    repeats = dataset.get("num_repeats")
                    return BenchmarkSpec(
                        dataset=str(dataset.get("name")),
                        agent=name,
                        num_repeats=repeats if isinstance(repeats, int) and repeats > 0 else 1,
                        jsonl_fpath=str(dataset.get("jsonl_fpath")),
                        prompt_config=dataset.get("prompt_config"),
                        prepare_script=dataset.get("prepare_script"),
                    )
    return None

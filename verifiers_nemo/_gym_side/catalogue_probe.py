"""Gym's own catalogue, read in the Gym runtime: ``python catalogue_probe.py OUT.json``.

Run by path with the Gym runtime's interpreter (nemo-gym >= 0.7, which has ``nemo_gym.registry``), with the working
directory and ``NEMO_GYM_EXTRA_ROOTS`` the caller chose. Writes one JSON document: every environment and benchmark
that Gym's combined catalogue (``discover_environment_catalog``) lists, with each config resolved by Gym's own
parser (``config_paths`` and ``_inherit_from`` applied) to its server entries (a benchmark's dataset, with its
prompt config, repeats and prepare script, among them). Nothing is started; nothing but nemo-gym
and the standard library is imported.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")


def _server_entries(config, to_container) -> dict:
    """The top-level entries of a resolved config that are servers (``name: {server_type: {...}}``)."""
    plain = to_container(config, resolve=False, throw_on_missing=False)
    return {
        name: value
        for name, value in plain.items()
        if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in SERVER_TYPES
    }


def _resolved(path: Path) -> tuple[dict | None, str | None]:
    from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
    from omegaconf import OmegaConf

    initial = OmegaConf.merge(
        GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT, OmegaConf.create({"config_paths": [str(path)]})
    )
    try:
        parsed = GlobalConfigDictParser().parse_no_environment(initial_global_config_dict=initial)
    except BaseException as exc:
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return _server_entries(parsed, OmegaConf.to_container), None


def _aliases() -> dict[str, str]:
    try:  # Gym's table of deprecated environment names; a data module, read only
        from nemo_gym._config_aliases import LEGACY_ENVIRONMENT_ALIASES
    except ImportError:
        return {}
    return dict(LEGACY_ENVIRONMENT_ALIASES)


def _flavors(listed: set[str]) -> list[dict]:
    """``environments/NAME/FLAVOR.yaml`` configs other than the default one, as ``gym env start --environment
    NAME/FLAVOR`` selects them (the catalogue lists each environment by its default config only)."""
    from nemo_gym import component_search_roots
    from nemo_gym.discovery import read_config_metadata

    found = []
    for root in component_search_roots():
        for path in sorted((root / "environments").glob("*/*.yaml")):
            name = f"{path.parent.name}/{path.stem}"
            if path.name in ("config.yaml", "manifest.yaml") or name in listed:
                continue
            listed.add(name)
            domain, description = read_config_metadata(path)
            servers, error = _resolved(path)
            found.append(
                {
                    "name": name,
                    "kind": "environment",
                    "config_path": str(path),
                    "folder": str(path.parent),
                    "description": description,
                    "domain": domain,
                    "status": "flavor",
                    "servers": servers,
                    "error": error,
                }
            )
    return found


def main(out: str) -> None:
    import io
    from contextlib import redirect_stdout

    from nemo_gym.registry import discover_environment_catalog

    noise = io.StringIO()  # Gym prints warnings while listing; keep our stdout clean
    with redirect_stdout(noise):
        catalog = discover_environment_catalog()
        entries = []
        for entry in catalog:
            if entry.name.startswith("resources_servers/"):
                continue  # resources-server configs: read by verifiers-nemo itself, as on every release
            servers, error = _resolved(Path(entry.config_path))
            entries.append(
                {
                    "name": entry.name,
                    "kind": entry.kind,
                    "config_path": str(entry.config_path),
                    "folder": str(entry.path),
                    "description": entry.description,
                    "domain": entry.domain,
                    "status": entry.status,
                    "servers": servers,
                    "error": error,
                }
            )
        entries += _flavors({e["name"] for e in entries})
    Path(out).write_text(json.dumps({"entries": entries, "aliases": _aliases()}, default=str))


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BaseException:
        traceback.print_exc()
        sys.exit(1)

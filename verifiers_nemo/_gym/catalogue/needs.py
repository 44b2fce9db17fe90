"""What a config needs beyond Gym itself (a judge model; a service, credential or download): ``classify_config``
and the heuristics it reads source text with."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..._judge.config import judge_names
from ..config import RESOURCES_SERVERS, RESPONSES_API_MODELS, config_strings, interpolations, server_entries
from ..tree import GymTree

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

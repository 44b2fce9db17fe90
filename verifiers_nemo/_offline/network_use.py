"""What an environment reaches the network for when it runs, known before it runs (``envs``, ``prepare --check``).

Read from what the environment ships, not by running it: packages its first start installs (and those that come
from a git repository), a judge endpoint, the external services its configs name, benchmark rows its prepare script
downloads, and the download calls in the code of its servers (Hugging Face, NLTK, tiktoken, plain URLs). The last is
a static reading of the servers' modules: a call there may sit on a path a run never takes, so it says "may".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

_DOWNLOAD_CALLS = re.compile(
    r"\b(load_dataset|snapshot_download|hf_hub_download|from_pretrained|nltk\.download|urlretrieve|"
    r"tiktoken\.get_encoding|tiktoken\.encoding_for_model|requests\.get|httpx\.get|urlopen)\s*\("
)
"""Calls that fetch from the internet unless what they fetch is cached or local."""
_NOT_SERVED = re.compile(r"(^|/)(tests?|scripts|misc|data)/|(^|/)[^/]*(prepare|preprocess|generate|create_|setup_)")
"""Files a server does not run: its tests and the scripts that make its data."""
_VCS = re.compile(r"(git|hg|svn|bzr)\+|\s@\s*(git|https?)\S*|^(git|https?)://")


@dataclass(frozen=True)
class NetworkUse:
    """One reason a run of an environment reaches the network."""

    what: str
    """``packages``, ``git``, ``judge``, ``external``, ``data`` or ``download``."""
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def network_uses(
    *,
    to_install: Sequence[str],
    server_dirs: Iterable[Path],
    judges: Sequence[str],
    external_reasons: Sequence[str],
    unprepared_data: str | None,
) -> list[NetworkUse]:
    """Every reason one environment's run reaches the network, from what it ships (see the module docstring)."""
    uses = []
    git = [r for r in to_install if _VCS.search(r)]
    plain = [r for r in to_install if r not in git]
    if plain:
        uses.append(
            NetworkUse(
                "packages",
                f"installs {', '.join(plain)} at its first start (from the package "
                "index, or from an offline folder: prepare --gather)",
            )
        )
    uses += [NetworkUse("git", f"installs {r} from its URL (not a package index) at its first start") for r in git]
    uses += [NetworkUse("judge", f"calls the judge {j} (--judge {j}=URL,MODEL: an endpoint you give)") for j in judges]
    uses += [NetworkUse("external", reason) for reason in external_reasons]
    if unprepared_data:
        uses.append(NetworkUse("data", f"its rows are downloaded by {unprepared_data} (prepare ENV, once)"))
    for directory in server_dirs:
        uses += [NetworkUse("download", f"may download at run time: {call}") for call in download_calls(directory)]
    return uses


@functools.cache
def download_calls(server_dir: Path) -> tuple[str, ...]:
    """``app.py:41 nltk.download(`` for each download call in the modules a server runs (cached per folder)."""
    found = []
    for path in sorted(server_dir.rglob("*.py")) if server_dir.is_dir() else ():
        relative = path.relative_to(server_dir).as_posix()
        if _NOT_SERVED.search(relative):
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            match = _DOWNLOAD_CALLS.search(line)
            if match and not line.lstrip().startswith("#"):
                found.append(f"{server_dir.name}/{relative}:{number} {match.group(1)}(")
    return tuple(found)


def network_cell(uses: Sequence[NetworkUse]) -> str:
    """The NETWORK column: the kinds of ``uses`` (``packages, judge, download?``), or ``-``."""
    kinds = dict.fromkeys("download?" if u.what == "download" else u.what for u in uses)
    return ", ".join(kinds) or "-"

"""A benchmark's rows as Gym sends them: its prepared (raw) rows with its prompt config applied by Gym's own code.

``gym eval run --benchmark NAME`` reads the file the benchmark's ``prepare_script`` wrote (``jsonl_fpath``), fills
the dataset's ``prompt_config`` (YAML ``user`` and ``system`` templates with ``{field}`` placeholders) from each row
into ``responses_create_params.input``, and repeats each row ``num_repeats`` times. The filling is nemo-gym's
``materialize_prompts`` (``nemo_gym.prompt``), run in the Gym runtime's interpreter on the whole file; its output is
cached by the input file, the prompt config and the runtime, so a taskset then streams it like any dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from .._exceptions import ConfigurationError, TasksetError
from .._gym import GymEnvironment, cache_dir
from .._gym.catalogue.gym_listing import runtime_python
from .._offline import OFFLINE_DIR_VAR, offline_folder

_MATERIALIZE = (
    "import sys\n"
    "from nemo_gym.prompt import materialize_prompts\n"
    "materialize_prompts(sys.argv[1], sys.argv[2], sys.argv[3])\n"
)


def benchmark_data(env: GymEnvironment) -> Path:
    """Where the benchmark's prepared rows are (Gym's ``jsonl_fpath``, yours first); a TasksetError saying how to
    prepare them when they are not there."""
    spec = env.benchmark
    assert spec is not None
    path = env.search.find(spec.jsonl_fpath)
    if path.is_file():
        return path
    offline = offline_folder()
    gathered = offline.data_file(spec.jsonl_fpath) if offline is not None else None
    if gathered is not None:
        return gathered
    if offline is not None:
        raise TasksetError(
            f"benchmark {env.name!r}: its rows ({spec.jsonl_fpath}) are not in the offline folder {offline.data}; "
            f"{offline.gather_hint(env.name)}."
        )
    raise TasksetError(
        f"{path}: benchmark {env.name!r} is not prepared (Gym's prepare script writes its rows there). Fix: "
        f"`verifiers-nemo prepare {env.name}` (runs {spec.prepare_script or 'its prepare script'}; needs the "
        f"network, as `gym eval prepare --benchmark {env.name}` does), or pass a prepared file: "
        f'-a \'{{"jsonl_path": "FILE"}}\' (Python: jsonl_path=).'
    )


def has_input(path: Path) -> bool:
    """Whether the first row of ``path`` already has ``responses_create_params.input`` (prompted rows: Gym refuses a
    prompt config on them, and they run as they are)."""
    try:
        with path.open("rb") as handle:
            first = next((line for line in handle if line.strip()), b"")
        row = json.loads(first) if first else {}
    except (OSError, ValueError):
        return False  # the taskset's own reading reports what is wrong with the file
    params = row.get("responses_create_params") if isinstance(row, dict) else None
    return isinstance(params, dict) and bool(params.get("input"))


def prompted_rows(env: GymEnvironment, raw: Path) -> Path:
    """``raw`` (a benchmark's prepared rows) with the benchmark's prompt config applied by nemo-gym, as a cached
    file; ``raw`` itself when the benchmark has no prompt config."""
    spec = env.benchmark
    if spec is None or not spec.prompt_config:
        return raw
    prompt = env.search.find(spec.prompt_config)
    if not prompt.is_file():
        raise ConfigurationError(
            f"benchmark {env.name!r} names the prompt config {spec.prompt_config}, which is not at {prompt}."
        )
    python = runtime_python(env.root)
    if python is None:
        raise ConfigurationError(
            f"benchmark {env.name!r}: no interpreter found for the nemo-gym at {env.root}, whose code applies the "
            "benchmark's prompt config. Fix: name the Gym runtime's interpreter (--gym-python / "
            "VERIFIERS_NEMO_GYM_PYTHON)."
        )
    out = cache_dir() / "benchmark-rows" / f"{env.name.replace('/', '--')}-{_key(raw, prompt, python)}.jsonl"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(f".{os.getpid()}.partial")
    done = subprocess.run(
        [str(python), "-c", _MATERIALIZE, str(raw.resolve()), str(prompt), str(partial)],
        cwd=env.root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TasksetError(
            f"{raw}: nemo-gym could not apply benchmark {env.name!r}'s prompt config ({spec.prompt_config}) to "
            f"these rows: {last}. Fix: pass the benchmark's raw prepared rows (fields the prompt names, no "
            "responses_create_params.input)."
        )
    os.replace(partial, out)
    return out


def _key(raw: Path, prompt: Path, python: Path) -> str:
    digest = hashlib.sha256()
    stat = raw.stat()
    digest.update(f"{raw.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{python}\0".encode())
    digest.update(prompt.read_bytes())
    digest.update(_MATERIALIZE.encode())
    return digest.hexdigest()[:16]


_PREPARE = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('benchmark_prepare', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "print(module.prepare())\n"
)
PREPARE_TIMEOUT_S = 3600.0


def prepare_benchmark(env: GymEnvironment) -> Path:
    """Write a benchmark's rows with its own prepare script (``prepare()`` of its ``prepare_script``, what ``gym eval
    prepare --benchmark NAME`` runs), in the Gym runtime's interpreter; where they are. Most scripts download from
    Hugging Face or the web: a TasksetError with the script's last words when it fails (offline, say)."""
    spec = env.benchmark
    assert spec is not None
    target = env.search.find(spec.jsonl_fpath)
    offline = offline_folder()
    if offline is not None:
        raise TasksetError(
            f"benchmark {env.name!r}: its prepare script downloads its rows, and {OFFLINE_DIR_VAR} says this machine "
            f"is offline; {offline.gather_hint(env.name)}."
        )
    if not spec.prepare_script:
        raise TasksetError(
            f"benchmark {env.name!r} names no prepare script: write its rows to {target} yourself, or pass "
            '-a \'{"jsonl_path": "FILE"}\'.'
        )
    script = env.search.find(spec.prepare_script)
    python = runtime_python(env.root)
    if python is None or not script.is_file():
        raise TasksetError(f"benchmark {env.name!r}: its prepare script {script} (or the Gym runtime) is not here.")
    root = script.parents[len(Path(spec.prepare_script).parts) - 1]  # the Gym root the script's paths are under
    try:
        done = subprocess.run(
            [str(python), "-c", _PREPARE, str(script)],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=PREPARE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise TasksetError(
            f"benchmark {env.name!r}: {spec.prepare_script} ran over {PREPARE_TIMEOUT_S:.0f} s."
        ) from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TasksetError(
            f"benchmark {env.name!r}: its prepare script {spec.prepare_script} failed: {last}. It downloads the "
            "benchmark's data (it needs the network, as Gym's own does); or prepare the file elsewhere and pass it: "
            '-a \'{"jsonl_path": "FILE"}\'.'
        )
    written = done.stdout.strip().splitlines()[-1:] or [str(target)]
    path = Path(written[0])
    return path if path.is_absolute() else root / path

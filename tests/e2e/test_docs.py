"""The docs run: every ``bash``/``sh`` and ``python`` block of README.md and docs/**/*.md, as written, read by
pytest-codeblocks; and every TOML and JSON block is what the test its mark names runs.

pytest-codeblocks (``extract_from_file``) reads the blocks and their annotations: a block that cannot run here says
so in the page's source, just above it, as ``<!--pytest.mark.skip(reason="...")-->`` (shown in pytest's report and,
by docs/hooks.py, on the site above the block). No other block is left out, but the README's first (the two lines a
new user runs, the second being this suite): its eval line runs as written in
``test_the_first_block_s_eval_runs_as_written``, its suite line is ``.ci/run``'s. Each block runs in a fresh copy of
the working tree, the same copy for every block of a page (a user follows a page top to bottom), with
``bash -e -o pipefail`` (every line must succeed) or, for Python, as ``python -m asyncio``
runs it (top-level ``await``; tests/e2e/docs_python.py).

The one substitution (``PLACEHOLDERS``, applied to a block's text before it runs) points the docs' placeholders at
stand-ins on 127.0.0.1, shared by every block of the module:

- ``http://gpu:8000/v1``, ``http://gpu-node:8000/v1``, ``http://vllm:8000/v1`` (your vLLM): a fake
  OpenAI-compatible server (tests/unit/fake_upstream.py) speaking Chat Completions and Responses, with vLLM-style
  token IDs and logprobs, serving the model ``Qwen/Qwen3-8B`` (the docs' model);
- ``URL`` (what ``verifiers-nemo replay-server ENV`` prints): that replay server, started as the docs say;
- ``HEAD_IP``: 127.0.0.1; ``RUN_DIR``: the newest run folder under ``outputs/evals`` (the one the last ``-s`` run
  printed);
- ``pip install`` is run as ``uv pip install`` (same arguments; uv's cache instead of pip downloading ~1 GB).

The blocks run in the venvs the Install page's lines build from the wheels (``uv build`` of the package and of
``environments/nemo_gym_env``, then ``pip install --find-links dist ...``): ``[nemogym,report,ray,inspect,docs,dev]``
on Python 3.12 first on PATH, ``[verifiers,ray]`` (no nemo-gym: verifiers 0.4 and nemo-gym 0.4 disagree on openai)
behind it for ``vf-eval``, whose Gym runtime is the first (``VERIFIERS_NEMO_GYM_PYTHON``). A block that installs
gets a fresh empty venv of its own. ``test_every_extra_installs_from_the_wheels`` checks those two venvs.

Inline commands (tables, prose) are no blocks: ``test_inline_commands_parse`` has the CLI's own parser accept
each full ``verifiers-nemo`` one, so a renamed or removed flag fails there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

from tests.unit.fake_upstream import FakeUpstream

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = (README, *sorted((ROOT / "docs").rglob("*.md")))
"""Every page a user reads: the README and the docs site's pages."""
RUNNABLE = ("bash", "sh", "python")
BLOCK_LIMIT_S = 420  # a cold Gym stack (or two) on a busy 2-core machine, vf-eval's import
INSTALL_LIMIT_S = 300
MODEL = "Qwen/Qwen3-8B"  # the stand-in's model: the docs' `-m Qwen/Qwen3-8B`
GPU_URLS = ("http://gpu:8000/v1", "http://gpu-node:8000/v1", "http://vllm:8000/v1")
GYM_EXTRAS = "nemogym,report,ray,inspect,docs,dev"
VF_EXTRAS = "verifiers,ray"


def _python312() -> str:
    """pyenv's 3.12.1 (DESIGN: uv must not download one), else the interpreter .venv was made from."""
    pyenv = subprocess.run(["pyenv", "root"], capture_output=True, text=True) if shutil.which("pyenv") else None
    if pyenv is not None and (Path(pyenv.stdout.strip()) / "versions/3.12.1/bin/python3").exists():
        return str(Path(pyenv.stdout.strip()) / "versions/3.12.1/bin/python3")
    return _python_says(ROOT / ".venv", "import sys; print(sys._base_executable)")


UV = [shutil.which("uv")] if shutil.which("uv") else ["python3", "-m", "uv"]  # as .ci/setup finds it


def _uv(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [*UV, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_LIMIT_S
    )
    assert proc.returncode == 0, f"uv {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "VERIFIERS_NEMO_", "PYTEST"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # fresh venvs compile what they import once, as a user's do
    env.update(UV_PYTHON_DOWNLOADS="never", PYTHONUNBUFFERED="1", OPENAI_API_KEY="sk-readme")
    return env


def _copy_tree(dest: Path) -> Path:
    """The working tree as a user's clone holds it (tracked and new files, nothing git ignores)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


# -- the venvs the Install lines build --------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    dist: Path
    gym: Path  # [nemogym,report,ray,inspect,dev]
    vf: Path  # [verifiers,ray]
    seconds: float


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Both wheels built with uv, and installed from them into two fresh venvs as the Install page says."""
    start = time.monotonic()
    tree = _copy_tree(tmp_path_factory.mktemp("wheels"))
    env = _base_env()
    python = _python312()
    _uv("build", "-q", "--wheel", "-p", python, "-o", "dist", ".", cwd=tree, env=env)
    _uv("build", "-q", "--wheel", "-p", python, "-o", "dist", "environments/nemo_gym_env", cwd=tree, env=env)
    venvs = {}
    for name, extras in (("gym", GYM_EXTRAS), ("vf", VF_EXTRAS)):
        venv = tmp_path_factory.mktemp(f"venv-{name}") / "venv"
        _uv("venv", "-q", "-p", python, venv, env=env)
        _uv("pip", "install", "-q", "-p", venv / "bin" / "python", "--find-links", "dist",
            f"verifiers-nemo[{extras}]", "nemo-gym-env", cwd=tree, env=env)  # fmt: skip
        venvs[name] = venv
    return Installed(tree / "dist", venvs["gym"], venvs["vf"], time.monotonic() - start)


def _python_says(venv: Path, code: str) -> str:
    # cwd: the venv, so `python -c` imports what is installed there, not this checkout's source
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], cwd=venv, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{venv}: {code}\n{proc.stderr}"
    return proc.stdout.strip()


def test_every_extra_installs_from_the_wheels(installed: Installed) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(GYM_EXTRAS.split(",")) | set(VF_EXTRAS.split(",")) == set(pyproject), "an extra is installed by no test"
    readme_install = README.read_text().split("\n## Install", 1)[1].split("\n## Quickstart", 1)[0]
    for page, install_text in (("README.md", readme_install), ("install.md", (ROOT / "docs/install.md").read_text())):
        for extra in pyproject:
            assert f"| `{extra}` |" in install_text, f"{page}'s extras table does not name the extra {extra!r}"
    assert sorted(p.name.split("-")[0] for p in installed.dist.glob("*.whl")) == ["nemo_gym_env", "verifiers_nemo"]

    # Importing nemo-gym, ray, inspect-ai or verifiers without compiled bytecode takes many seconds: find them.
    gym = _python_says(
        installed.gym,
        "import importlib.metadata as m, importlib.util as u, verifiers_nemo, nemo_gym_env; "
        "missing = [n for n in ('nemo_gym', 'ray', 'plotly', 'jinja2', 'inspect_ai', 'pytest', 'pytest_asyncio', "
        "'pytest_codeblocks', 'mkdocs', 'material', 'mkdocstrings') if u.find_spec(n) is None]; "
        "print(m.version('nemo-gym'), verifiers_nemo.__file__, missing, sep='|')",
    )
    nemo_gym_version, module_file, missing = gym.split("|")
    assert missing == "[]", f"[{GYM_EXTRAS}] did not install {missing}"
    assert nemo_gym_version.startswith("0.4."), gym  # Python 3.12: nemo-gym 0.4.x
    assert str(installed.gym) in module_file, f"verifiers-nemo is not the wheel's copy: {module_file}"
    help_text = subprocess.run(
        [str(installed.gym / "bin" / "verifiers-nemo"), "--help"], capture_output=True, text=True, timeout=120
    )
    assert help_text.returncode == 0 and "eval" in help_text.stdout, help_text.stderr

    vf = _python_says(
        installed.vf,
        "import importlib.metadata as m, importlib.util as u, verifiers_nemo, nemo_gym_env; "
        "assert u.find_spec('verifiers') and u.find_spec('ray'); "
        "print(m.version('openai'), u.find_spec('nemo_gym') is None)",
    )
    openai_version, no_gym = vf.split()
    assert tuple(int(x) for x in openai_version.split(".")[:2]) >= (2, 54), vf  # not downgraded by nemo-gym
    assert no_gym == "True", "the [verifiers] venv has nemo-gym"
    assert (installed.vf / "bin" / "vf-eval").exists() and (installed.vf / "bin" / "verifiers-nemo").exists()
    print(f"wheels built and both venvs installed in {installed.seconds:.1f} s")


# -- the stand-ins behind the placeholders -------------------------------------------------------------


class ThreadedFake:
    """``FakeUpstream`` (token IDs on) served from a loop of its own, so subprocesses and other loops reach it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="readme-fake", daemon=True)
        self.fake = FakeUpstream(MODEL, token_ids=True)

    def __enter__(self) -> FakeUpstream:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(30)
        return self.fake

    def __exit__(self, *exc: object) -> None:
        future: Future = asyncio.run_coroutine_threadsafe(self.fake.close(), self.loop)
        future.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@dataclass
class StandIns:
    fake: FakeUpstream
    replay_url: str
    placeholders: dict[str, str]
    env: dict[str, str]
    clones: dict[Path, Path]
    """Each page's copy of the working tree, made for its first block: its blocks run there in order."""


@pytest.fixture(scope="module")
def stand_ins(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIns]:
    tmp = tmp_path_factory.mktemp("replay")
    env = _base_env()
    env["PATH"] = os.pathsep.join([str(installed.gym / "bin"), str(installed.vf / "bin"), env.get("PATH", "")])
    env["VERIFIERS_NEMO_GYM_PYTHON"] = str(installed.gym / "bin" / "python")
    # A Python 3.12 on PATH (behind the venvs), as a user's machine has one: `uv venv -p 3.12` finds it there.
    env["PATH"] = os.pathsep.join([env["PATH"], str(Path(_python312()).parent)])
    port_file = tmp / "replay.url"
    replay = subprocess.Popen(
        ["verifiers-nemo", "replay-server", "example_multi_step", "--port-file", str(port_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with ThreadedFake() as fake:
            deadline = time.monotonic() + 120
            while not port_file.exists():
                assert replay.poll() is None, "verifiers-nemo replay-server exited"
                assert time.monotonic() < deadline, "verifiers-nemo replay-server printed no URL within 120 s"
                time.sleep(0.1)
            replay_url = port_file.read_text().strip()
            placeholders = dict.fromkeys(GPU_URLS, fake.base_url)
            newest_run = '"$(ls -td outputs/evals/*/* | head -1)"'
            placeholders |= {"URL": replay_url, "HEAD_IP": "127.0.0.1", "RUN_DIR": newest_run}
            yield StandIns(fake, replay_url, placeholders, env, {})
    finally:
        replay.terminate()
        replay.wait(30)


def substitute(code: str, placeholders: dict[str, str]) -> str:
    """The docs' placeholders replaced, whole words only (``URL`` is not part of ``--client.base-url``)."""
    for name, value in placeholders.items():
        code = re.sub(rf"(?<![\w./-]){re.escape(name)}(?![\w-])", value, code)
    return re.sub(r"(?<![\w-])(?<!uv )pip install\b", "uv pip install", code)


# -- the blocks ----------------------------------------------------------------------------------------


def _page_blocks(syntaxes: tuple[str, ...]) -> list[tuple[Path, object]]:
    """(page, block) for every block of these syntaxes, README's first left out (it is CI itself)."""
    found = []
    for page in DOCS:
        blocks = extract_from_file(page)
        for block in blocks[1:] if page == README else blocks:
            if block.syntax in syntaxes:
                found.append((page, block))
    return found


def _blocks() -> list:
    params = []
    for page, block in _page_blocks(RUNNABLE):
        marks = [eval(mark, {"pytest": pytest, "sys": sys}) for mark in block.marks]  # as pytest-codeblocks does
        params.append(pytest.param(page, block, id=f"{page.relative_to(ROOT)}:{block.lineno}", marks=marks))
    return params


def _run_block(argv: list[str], code: str, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        argv,
        input=code,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_LIMIT_S,
        start_new_session=True,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the block failed (exit {proc.returncode}):\n{code}\n--- output ---\n{output[-6000:]}"
    return output


@pytest.mark.parametrize(("page", "block"), _blocks())
def test_doc_block(
    page: Path, block, stand_ins: StandIns, installed: Installed, tmp_path_factory: pytest.TempPathFactory
) -> None:
    code = substitute(block.code, stand_ins.placeholders)
    if page not in stand_ins.clones:
        stand_ins.clones[page] = _copy_tree(tmp_path_factory.mktemp("clone"))
    cwd = stand_ins.clones[page]
    tmp_path = tmp_path_factory.mktemp("block")
    env = dict(stand_ins.env)
    if block.syntax == "python":
        before = len(stand_ins.fake.requests)
        output = _run_block([str(installed.gym / "bin" / "python"), str(Path(__file__).with_name("docs_python.py"))],
                            code, cwd, env)  # fmt: skip
        results = [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("DOCS-RESULT")]
        if "result" in code:
            assert results, f"the block left no result:\n{output[-3000:]}"
            assert results[0]["error"] is None, results
            if "return_tokens=True" in code:
                assert results[0]["token_ids"], results
                assert any(r.body.get("return_token_ids") for r in stand_ins.fake.requests[before:]), "tokens not asked"
        return
    if re.search(r"(?<![\w-])pip install\b", block.code):  # an install block: a fresh venv of its own
        venv = tmp_path / "venv"
        _uv("venv", "-q", "-p", _python312(), venv, env=env)
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = os.pathsep.join([str(venv / "bin"), env["PATH"]])
        _run_block(["bash", "-e", "-o", "pipefail"], code, cwd, env)
        elsewhere = re.findall(r"pip install -p (\S+/bin/python)", block.code)  # a venv the block made itself
        for python in elsewhere:
            _python_says((cwd / python).parents[1], "import verifiers_nemo, nemo_gym")
        if not elsewhere:
            _python_says(venv, "import verifiers_nemo, nemo_gym, nemo_gym_env")
            assert (venv / "bin" / "verifiers-nemo").exists()
        return
    _run_block(["bash", "-e", "-o", "pipefail"], code, cwd, env)


def test_the_first_block_s_eval_runs_as_written() -> None:
    """The README's first line, as written, from the repository's root: set up (idempotent: CI has just run it) and
    a real eval of a packaged environment with the replay policy, every recorded reward reproduced."""
    first = extract_from_file(README)[0]
    line = first.code.splitlines()[0].split("#", 1)[0].strip()
    assert line == "bash .ci/setup && .venv/bin/verifiers-nemo eval example_multi_step", line
    output = _run_block(["bash", "-e", "-o", "pipefail"], line, ROOT, dict(os.environ))
    assert re.search(r"Replay\s+5/5 rewards equal the recorded ones", output), output[-3000:]


def test_the_first_block_is_what_ci_runs() -> None:
    """The README's first block is not run as a block (its second line is this suite): .ci/run must run exactly its
    setup and suite, and its first line is run by the test above."""
    first = extract_from_file(README)[0]
    commands = [line.split("#", 1)[0].strip() for line in first.code.splitlines() if line.strip()]
    assert commands[0].startswith("bash .ci/setup && ") and commands[1].startswith("bash .ci/setup-tests && ")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "bash .ci/setup-tests" in ci and commands[1].split(" && ", 1)[1] in ci
    assert "bash .ci/setup\n" in (ROOT / ".ci" / "setup-tests").read_text()


def test_inline_commands_parse() -> None:
    """Commands the docs give inline (tables, prose) are not blocks: each ``verifiers-nemo`` one that is not a
    synopsis (``[optional]``, ``A|B``, ``ENV...``) or a bare name must at least be accepted by the CLI's parser."""
    from markdown_it import MarkdownIt

    from verifiers_nemo._cli.parser import build_parser

    spans = [
        child.content
        for page in DOCS
        for token in MarkdownIt("commonmark").enable("table").parse(page.read_text())
        for child in token.children or []
        if child.type == "code_inline" and child.content.startswith("verifiers-nemo ")
    ]
    full = [span for span in spans if not any(mark in span for mark in ("[", "|", "...", "<"))]
    assert len(full) >= 5, spans
    refused = []
    for span in full:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                build_parser().parse_args(shlex.split(span)[1:])
        except SystemExit as exc:
            # 0: `--help`; "arguments are required": `verifiers-nemo report` names a command
            if exc.code != 0 and "arguments are required" not in said.getvalue():
                refused.append(f"{span}: {next(x for x in said.getvalue().splitlines() if 'error:' in x)}")
    assert not refused, f"the CLI refuses these commands of the docs: {refused}"

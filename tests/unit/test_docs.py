"""The docs are built and checked like code (tests/e2e/test_docs.py runs their shell and Python blocks):

* the site builds with ``mkdocs build --strict`` (a broken link or anchor, a page missing from the nav, a warning of
  mkdocstrings fails), its CLI reference is the parser's own ``--help`` and its config tables hold every field;
* the reference pages as committed (read on GitHub) are what docs/hooks.py generates from the parser and the config
  classes;
* every error message the code can raise is quoted on the Troubleshooting page;
* every vLLM tool or reasoning parser the Evaluate guide names is one vLLM registers (the suite's vLLM's source);
* every TOML and JSON block is what the test its mark names runs, and the README's links resolve.
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = (ROOT / "README.md", *sorted(DOCS.rglob("*.md")))
TROUBLESHOOTING = DOCS / "troubleshooting.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_the_site_builds_strictly_with_every_page_in_its_nav(site: Path) -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, f"{page} is in no nav entry of mkdocs.yml"
        assert (site / page.relative_to(DOCS).with_suffix("") / "index.html").exists() or page.name == "index.md"


def test_the_cli_reference_is_every_command_s_help(site: Path) -> None:
    from verifiers_nemo._cli.parser import build_parser

    shown = _text(site / "reference" / "cli" / "index.html")
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        for action in command._actions:
            for flag in action.option_strings:
                assert flag in shown, f"the CLI reference lacks {name} {flag}"
            if action.help and action.help != argparse.SUPPRESS:
                first_words = " ".join(action.help.split()[:4]).replace("%%", "%")
                assert first_words in " ".join(shown.split()), f"the CLI reference lacks the help of {name} {action}"


def test_the_config_reference_lists_every_field_of_our_verifiers_configs(site: Path) -> None:
    from tests.options_registry import verifiers_options

    shown = _text(site / "reference" / "config" / "index.html")
    for option in verifiers_options():
        assert option in shown, f"the config reference lacks {option}"


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_what_the_parser_the_config_classes_and_the_code_give() -> None:
    """reference/cli.md, config.md, python.md and training-data.md are committed with their generated parts, so they
    read in the repository; a flag, a help text, a config field, a public signature or docstring, or a training-data
    column changed without `python docs/hooks.py` fails here. (Generated with the suite's Python: argparse's layout
    differs a little between Python releases.)"""
    hooks = _hooks()
    cli, config, python, columns = (DOCS / name for name in hooks.REFERENCE_PAGES)
    assert cli.read_text().count(hooks.CLI_END) == 1, "reference/cli.md has lost its generated part's markers"
    assert config.read_text().count(hooks.CONFIG_END) == 2, "reference/config.md has lost a config table's markers"
    import verifiers_nemo

    documented = set(re.findall(r"<!-- python-api: verifiers_nemo\.(\w+) -->", python.read_text()))
    exceptions = {n for n in verifiers_nemo.__all__ if n in vars(verifiers_nemo._exceptions)}  # the tree, together
    public = set(verifiers_nemo.__all__) - exceptions
    assert public <= documented, f"reference/python.md documents no {sorted(public - documented)}"
    assert columns.read_text().count(hooks.COLUMNS_END) == 4, "reference/training-data.md has lost a format's table"
    for page in (cli, config, python, columns):
        text = page.read_text()
        assert hooks.regenerate(text) == text, (
            f"{page.relative_to(ROOT)} is not what the code gives: run `.venv/bin/python docs/hooks.py` and commit it"
        )
    drifted = {
        cli: lambda t: t.replace(" --env-args ", " --old ", 1),
        config: lambda t: t.replace("\n| `", "\n| `stale", 1),
        python: lambda t: t.replace("`RolloutResult.from_dict`", "`RolloutResult.from_old`", 1),
        columns: lambda t: t.replace("| `labels` |", "| `label` |", 1),
    }
    for page, drift in drifted.items():
        text = page.read_text()
        stale = drift(text)
        assert stale != text and hooks.regenerate(stale) == text  # a drifted page is found, and written back


# -- Troubleshooting quotes every message ---------------------------------------------------------------

USER_FACING = {
    "ConfigurationError", "PreflightError", "TasksetError", "GymRuntimeError", "StackStartError",
    "UnknownEnvironmentError", "ReportError", "RowError", "fail", "InvalidResult", "GymAgentError", "GymServerDown",
    "WorkerLost", "UpstreamHTTPError", "UpstreamProtocolError", "_conversion_error", "ExactTokensUnsupported",
    "RolloutTimeout", "UpstreamTimeout", "UpstreamError", "ArgumentTypeError",
}  # fmt: skip
"""Exceptions whose message a user reads (the CLI prints it, or it is a result's ``error.message``); the others
(``RuntimeError``, ``ValueError`` ...) are programming errors."""
MIN_QUOTE = 20
"""A message is quoted when one of its literal pieces this long (or its longest, when none is) is on the page: what
a user searches the page for."""


def _literal(node: ast.expr) -> list[str] | None:
    """A message's literal pieces (between what it fills in), or None when it is built elsewhere."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        pieces, current = [], ""
        for value in node.values:
            if isinstance(value, ast.Constant):
                current += str(value.value)
            else:
                pieces.append(current)
                current = ""
        return [*pieces, current]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        if left is None or right is None:
            return None
        return [*left[:-1], left[-1] + right[0], *right[1:]]
    return None


def raised_messages() -> dict[str, list[str]]:
    """Where each user-facing message is built, and its literal pieces a quote may match."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "verifiers_nemo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else node if isinstance(node, ast.Call) else None
            if not isinstance(call, ast.Call) or not call.args:
                continue
            name = getattr(call.func, "id", getattr(call.func, "attr", ""))
            if name not in USER_FACING:
                continue
            pieces = _literal(call.args[0])
            if pieces is None:
                continue
            cleaned = sorted((" ".join(p.split()).strip(" .:;,()`") for p in pieces), key=len, reverse=True)
            quotable = [p for p in cleaned if len(p) >= MIN_QUOTE] or cleaned[:1]
            if quotable and len(quotable[0]) >= 8:
                found[f"{path.relative_to(ROOT)}:{call.lineno}"] = quotable
    return found


def test_troubleshooting_quotes_every_message_the_code_raises() -> None:
    from verifiers_nemo import _exceptions
    from verifiers_nemo._upstreams.refusals import KNOWN_REFUSALS

    page = " ".join(TROUBLESHOOTING.read_text().replace("\\|", "|").split())
    messages = raised_messages()
    assert len(messages) > 150, len(messages)
    missing = [f"{where}: {pieces[0]!r}" for where, pieces in messages.items() if not any(p in page for p in pieces)]
    assert not missing, "Troubleshooting does not quote these messages:\n" + "\n".join(missing)
    for refusal in KNOWN_REFUSALS:
        assert refusal.cause.split(":")[0][:60] in page, refusal.cause
    types = {c.type for c in vars(_exceptions).values() if isinstance(c, type) and hasattr(c, "type")}
    summary_errors = TROUBLESHOOTING.read_text().split("## Errors in the summary", 1)[1].split("\n## ", 1)[0]
    for kind in types - {"upstream", "error"}:  # the two bases: every error a result carries is a leaf
        assert f"`{kind}`" in summary_errors, f"Troubleshooting's Errors in the summary has no row for {kind}"


# -- vLLM parsers ---------------------------------------------------------------------------------------


def _registered(venv_python: Path, package: str) -> set[str]:
    (site_packages,) = venv_python.parent.parent.glob("lib/python3*/site-packages")
    source = (site_packages / "vllm" / package / "__init__.py").read_text()
    return set(re.findall(r'"([a-z0-9_.-]+)":\s*\(', source))


def test_every_vllm_parser_the_evaluate_guide_names_is_registered() -> None:
    from tests.realmodel.server import NotBuilt, find_build

    try:
        python = find_build().python
    except NotBuilt as exc:
        pytest.fail(str(exc), pytrace=False)
    named = PAGES[0].read_text() + (DOCS / "guides" / "evaluate.md").read_text()
    tools = set(re.findall(r"--tool-call-parser ([\w.-]+)", named))
    reasoning = set(re.findall(r"--reasoning-parser ([\w.-]+)", named))
    assert {"hermes", "llama3_json", "mistral"} <= tools and "qwen3" in reasoning
    assert not tools - _registered(python, "tool_parsers"), tools - _registered(python, "tool_parsers")
    assert not reasoning - _registered(python, "reasoning"), reasoning - _registered(python, "reasoning")


# -- TOML and JSON blocks; links ------------------------------------------------------------------------


def _structured_blocks() -> list:
    return [
        pytest.param(page, block, id=f"{page.relative_to(ROOT)}:{block.lineno}")
        for page in PAGES
        for block in extract_from_file(page)
        if block.syntax in ("toml", "json")
    ]


@pytest.mark.parametrize(("page", "block"), _structured_blocks())
def test_every_toml_and_json_block_parses_and_says_which_test_runs_it(page: Path, block) -> None:
    if block.syntax == "json":
        json.loads(block.code)
        return
    tomllib.loads(block.code.replace('"URL"', '"http://127.0.0.1:1/v1"'))
    reasons = [m for mark in block.marks for m in re.findall(r'reason="([^"]*)"', mark)]
    named = [ROOT / name for reason in reasons for name in re.findall(r"tests/[\w/]+\.py", reason)]
    tied = {  # blocks whose runner reads them through a helper: the helper's own checks below
        "README.md": "tests/unit/test_docs.py",
    }
    assert named or page.name in tied, f"{page.name}:{block.lineno}: no mark names the test that runs this block"
    for test in named:
        assert test.exists(), f"{page.name}:{block.lineno} names {test}, which does not exist"


def _toml_blocks(page: Path) -> list[dict]:
    return [tomllib.loads(b.code) for b in extract_from_file(page) if b.syntax == "toml"]


def test_the_readme_s_toml_is_the_first_source_of_the_training_recipe() -> None:
    from tests.e2e.train_engines import guide_toml

    (readme,) = _toml_blocks(ROOT / "README.md")
    recipe = guide_toml('name = "qwen3"')["orchestrator"]["train"]["source"][0]
    (shown,) = readme["orchestrator"]["train"]["source"]
    assert shown["name"] == recipe["name"] and shown["env"]["taskset"] == recipe["env"]["taskset"]
    assert shown["env"]["agent"]["harness"]["id"] == recipe["env"]["agent"]["harness"]["id"]


def test_the_row_format_example_is_a_row_the_taskset_accepts(tmp_path: Path) -> None:
    """The Evaluate guide's JSON row is a valid row of its environment, and is the row its shell block writes."""
    from verifiers_nemo import NeMoGymTaskset

    guide = DOCS / "guides" / "evaluate.md"
    (row,) = [json.loads(b.code) for b in extract_from_file(guide) if b.syntax == "json"]
    (writes,) = [b.code for b in extract_from_file(guide) if b.syntax == "bash" and "my_rows.jsonl <<" in b.code]
    assert json.loads(writes.split("<<'EOF'\n", 1)[1].split("\nEOF", 1)[0]) == row
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    (task,) = list(NeMoGymTaskset("example_session_state_mgmt", jsonl_path=tmp_path / "rows.jsonl"))
    assert task.row["initial_count"] == 1


def test_the_resume_guide_s_clean_up_keeps_the_good_lines_and_survives_a_line_cut_off(tmp_path: Path) -> None:
    """The Evaluate guide's clean-up (keep the rollouts that did not fail) on a results.jsonl whose run was killed
    while writing its last line: the good line stays, the errored one and the cut-off one go, and it exits 0."""
    guide = DOCS / "guides" / "evaluate.md"
    (block,) = [b.code for b in extract_from_file(guide) if b.syntax == "bash" and "results.jsonl <<'EOF'" in b.code]
    script = block.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    good = json.dumps({"task_index": 0, "rollout_index": 0, "reward": 1.0, "error": None}) + "\n"
    failed = json.dumps({"task_index": 1, "rollout_index": 0, "error": {"type": "timeout", "message": "m"}}) + "\n"
    results = tmp_path / "results.jsonl"
    results.write_text(good + failed + '{"task_index": 2, "rollout_in')
    proc = subprocess.run([sys.executable, "-", str(results)], input=script, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert results.read_text() == good


def _slug(heading: str) -> str:
    """Python-Markdown's toc anchor of a heading (mkdocs' default)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_s_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", readme)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) > 10, local
    for link in local:
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"README links to {link}: no such heading"


def test_every_row_of_the_failure_matrix_names_tests_that_exist() -> None:
    """Troubleshooting's failure matrix says which test checks each row: each named test is a test of that file."""
    text = (DOCS / "troubleshooting.md").read_text()
    matrix = text.split("### The failure matrix", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in matrix.splitlines() if line.startswith("| ") and not line.startswith("| what fails")]
    assert len(rows) >= 10
    for row in rows:
        named = re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`|`(tests/[\w/]+\.py)`", row)
        assert named, f"a row of the failure matrix names no test: {row[:80]}"
        current = None
        for path, test, whole_file in named:
            current = path or whole_file or current
            assert current is not None and (ROOT / current).is_file(), (row[:60], current)
            if test:
                defined = {n.name for n in ast.walk(ast.parse((ROOT / current).read_text())) if hasattr(n, "name")}
                assert test in defined, f"{current}::{test} (failure matrix) is no test of that file"

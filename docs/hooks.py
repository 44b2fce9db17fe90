"""mkdocs hooks (mkdocs.yml ``hooks:``): what the site shows that the Markdown source keeps for the test suite.

* The CLI reference (``reference/cli.md``) is generated at build time from the parser itself, so it cannot drift from
  ``verifiers-nemo --help``: its ``<!-- cli-reference -->`` line becomes every command's help, as ``--help`` prints it.
* The config keys of ``nemo-gym-env`` (``reference/config.md``) are read from its config classes at build time: each
  ``<!-- config-keys: CLASS --env.prefix. -->`` line becomes a table of that class's fields.
* A code block the docs test does not run as written carries ``<!--pytest.mark.skip(reason="...")-->`` just above it
  (pytest-codeblocks' mark, invisible in Markdown): the site shows that reason above the block, so a reader sees how
  the example is checked, or why it is not run here.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

CLI_MARKER = "<!-- cli-reference -->"
SKIP_MARK = re.compile(r'^<!--pytest\.mark\.skip\(reason="(?P<reason>[^"]*)"\)-->$', re.MULTILINE)
HELP_COLUMNS = "100"


def cli_reference() -> str:
    """Every ``verifiers-nemo`` command's ``--help``, as printed at 100 columns, one section each."""
    from verifiers_nemo._cli.parser import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS  # argparse wraps to the terminal's width: fix it
    try:
        parser = build_parser()
        (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parts = ["## verifiers-nemo", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, command in commands.choices.items():
            parts += [f"## {name}", "", "```text", command.format_help().rstrip(), "```", ""]
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(parts)


def _checked_note(match: re.Match[str]) -> str:
    reason = match.group("reason")
    return f'!!! note "How the test suite checks this example"\n    {reason}\n'


CONFIG_MARKER = re.compile(r"^<!-- config-keys: (?P<cls>\w+) (?P<prefix>\S+) -->$", re.MULTILINE)
CONFIG_MODULE = "verifiers_nemo/_verifiers_v1.py"


def config_keys(cls: str, prefix: str) -> str:
    """A table of the fields a verifiers config class of ours declares (read from its source: this needs no verifiers
    install), with each field's type, default and docstring: the keys a TOML table or ``--env.*`` flag sets."""
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / CONFIG_MODULE).read_text()
    (node,) = (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    rows = ["| key | flag | type | default | what |", "|---|---|---|---|---|"]
    body = node.body
    for i, item in enumerate(body):
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        name = item.target.id
        doc = ""
        following = body[i + 1] if i + 1 < len(body) else None
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            doc = " ".join(str(following.value.value).split())
        default = ast.unparse(item.value) if item.value is not None else "required"
        default = re.sub(r"^Field\((.*?)(, (ge|gt)=.*)?\)$", r"\1", default)
        flag = f"{prefix}{name.replace('_', '-')}"
        cell = doc.replace("|", "\\|")
        rows.append(f"| `{name}` | `{flag}` | `{ast.unparse(item.annotation)}` | `{default}` | {cell} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    markdown = CONFIG_MARKER.sub(lambda m: config_keys(m.group("cls"), m.group("prefix")), markdown)
    return SKIP_MARK.sub(_checked_note, markdown)

"""The generated parts of the reference pages, and the mkdocs hooks (mkdocs.yml ``hooks:``) of the site.

* The CLI reference (``reference/cli.md``) is generated from the parser itself: between its ``<!-- cli-reference -->``
  and ``<!-- /cli-reference -->`` lines, every command's help as ``--help`` prints it at 100 columns.
* The config keys of ``nemo-gym-env`` (``reference/config.md``) are read from its config classes: between each
  ``<!-- config-keys: CLASS --env.prefix. -->`` line and the next ``<!-- /config-keys -->``, a table of that class's
  fields.

Both are committed, so they read on GitHub as on the site; ``python docs/hooks.py`` writes them again after a change to
the parser or the config classes (``--check``: exit 1 when a page is not what they give), and
``tests/unit/test_docs.py`` fails when a committed page drifts. The site build regenerates them too.
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
CLI_END = "<!-- /cli-reference -->"
CONFIG_END = "<!-- /config-keys -->"
REFERENCE_PAGES = ("reference/cli.md", "reference/config.md")
"""The pages, under docs/, whose generated parts are committed."""
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


CONFIG_MARKER = re.compile(
    r"^(?P<start><!-- config-keys: (?P<cls>\w+) (?P<prefix>\S+) -->)\n.*?^<!-- /config-keys -->$",
    re.MULTILINE | re.DOTALL,
)
CLI_REGION = re.compile(rf"^{re.escape(CLI_MARKER)}\n.*?^{re.escape(CLI_END)}$", re.MULTILINE | re.DOTALL)
CONFIG_MODULE = "verifiers_nemo/_verifiers_v1.py"


def config_keys(cls: str, prefix: str) -> str:
    """A table of the fields a verifiers config class of ours declares (read from its source: this needs no verifiers
    install), with each field's type, default and docstring: the keys a TOML table or ``--env.*`` flag sets."""
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / CONFIG_MODULE).read_text()
    tree = ast.parse(source)
    (node,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
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
        default = _named(re.sub(r"^Field\((.*?)(, (ge|gt)=.*)?\)$", r"\1", default), tree)
        flag = f"{prefix}{name.replace('_', '-')}"
        cell = doc.replace("|", "\\|")
        annotation = _named(ast.unparse(item.annotation), tree)
        kind = " or ".join(f"`{part}`" for part in annotation.split(" | "))  # no `|` in a cell (GitHub splits it)
        rows.append(f"| `{name}` | `{flag}` | {kind} | `{default}` | {cell} |")
    return "\n".join(rows)


def _named(text: str, tree: Any) -> str:
    """A default or type that is a module-level name, as its value: a name the config module assigns (a type
    alias), or imports from this package (a constant, read by importing the module that defines it)."""
    import ast
    import importlib

    if not text.isidentifier():
        return text
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == text for t in statement.targets):
            return ast.unparse(statement.value)
        if isinstance(statement, ast.ImportFrom) and statement.level and any(a.name == text for a in statement.names):
            module = importlib.import_module(f"verifiers_nemo{'.' + statement.module if statement.module else ''}")
            return repr(getattr(module, text))
    return text


def regenerate(markdown: str) -> str:
    """``markdown`` with its generated parts (between their start and end lines) written again from the code."""
    markdown = CLI_REGION.sub(lambda _: f"{CLI_MARKER}\n\n{cli_reference()}\n{CLI_END}", markdown)
    return CONFIG_MARKER.sub(
        lambda m: f"{m.group('start')}\n\n{config_keys(m.group('cls'), m.group('prefix'))}\n\n{CONFIG_END}", markdown
    )


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return SKIP_MARK.sub(_checked_note, regenerate(markdown))


def main(argv: list[str]) -> int:
    """``python docs/hooks.py [--check]``: write the reference pages' generated parts again (or only check them)."""
    from pathlib import Path

    docs = Path(__file__).resolve().parent
    stale = []
    for name in REFERENCE_PAGES:
        page = docs / name
        text = page.read_text()
        fresh = regenerate(text)
        if fresh != text:
            stale.append(name)
            if "--check" not in argv:
                page.write_text(fresh)
    verb = "are not what the code gives" if "--check" in argv else "written again"
    print(f"docs/{', docs/'.join(stale)}: {verb}" if stale else "the reference pages are what the code gives")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # this checkout's package
    raise SystemExit(main(sys.argv[1:]))

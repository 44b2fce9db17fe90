"""The generated parts of the reference pages, and the mkdocs hooks (mkdocs.yml ``hooks:``) of the site.

* The CLI reference (``reference/cli.md``) is generated from the parser itself: between its ``<!-- cli-reference -->``
  and ``<!-- /cli-reference -->`` lines, every command's help as ``--help`` prints it at 100 columns.
* The config keys of ``nemo-gym-env`` (``reference/config.md``) are read from its config classes: between each
  ``<!-- config-keys: CLASS --env.prefix. -->`` line and the next ``<!-- /config-keys -->``, a table of that class's
  fields.
* The Python API reference (``reference/python.md``) is read from the package's signatures and docstrings with griffe
  (what mkdocstrings reads; the ``docs`` extra): between each ``<!-- python-api: verifiers_nemo.NAME -->`` line and
  the next ``<!-- /python-api -->``, that object's signature, docstring, fields and public methods (signatures in
  ``py`` blocks: highlighted as Python, and not taken for examples to run by tests/e2e/test_docs.py).
* The training-data formats' columns (``reference/training-data.md``) are read from
  ``verifiers_nemo/_export/schema.py``: between each ``<!-- training-data-columns: FORMAT -->`` line and the next
  ``<!-- /training-data-columns -->``.

All are committed, so they read on GitHub as on the site; ``python docs/hooks.py`` writes them again after a change to
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
REFERENCE_PAGES = ("reference/cli.md", "reference/config.md", "reference/python.md", "reference/training-data.md")
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


# -- the training-data formats' columns --------------------------------------------------------------------

COLUMNS_END = "<!-- /training-data-columns -->"
COLUMNS_MARKER = re.compile(
    r"^(?P<start><!-- training-data-columns: (?P<format>[\w-]+) -->)\n.*?^<!-- /training-data-columns -->$",
    re.MULTILINE | re.DOTALL,
)


def training_data_columns(format_name: str) -> str:
    """A table of one training-data format's columns: name, type, what it holds."""
    from verifiers_nemo._export.schema import COLUMNS

    rows = ["| column | type | what it holds |", "|---|---|---|"]
    for column in COLUMNS[format_name]:
        rows.append(f"| `{column.name}` | `{column.type}` | {column.description.replace('|', '/')} |")
    return "\n".join(rows)


# -- the Python API ------------------------------------------------------------------------------------------

API_END = "<!-- /python-api -->"
API_MARKER = re.compile(
    r"^(?P<start><!-- python-api: (?P<path>[\w.]+) -->)\n.*?^<!-- /python-api -->$", re.MULTILINE | re.DOTALL
)
SIGNATURE_COLUMNS = 100
_PACKAGE: Any = None


def _package() -> Any:
    """The package as griffe reads it (its source, statically: nothing is imported), loaded once."""
    global _PACKAGE
    if _PACKAGE is None:
        from pathlib import Path

        import griffe

        root = Path(__file__).resolve().parents[1]
        _PACKAGE = griffe.load("verifiers_nemo", search_paths=[str(root)], resolve_aliases=True)
    return _PACKAGE


def python_api(path: str) -> str:
    """One public object's reference in Markdown: its signature, docstring, fields (a dataclass's, a class's
    documented attributes and properties) and public methods; a module: its docstring and its classes."""
    obj = _target(_package()[path.removeprefix("verifiers_nemo.")])
    name = path.rsplit(".", 1)[-1]
    if obj.kind.value == "module":
        parts = [_docstring(obj)]
        for member in obj.members.values():
            if member.is_alias:  # an import
                continue
            if member.kind.value == "class" and not member.name.startswith("_") and member.docstring:
                parts.append(f"- `{member.name}`: {_first_paragraph(member)}")
        return "\n\n".join(filter(None, parts[:1])) + "\n\n" + "\n".join(parts[1:])
    parts = [f"### `{name}`", "```py\n" + _signature(obj, name) + "\n```", _docstring(obj)]
    if obj.kind.value == "class":
        fields = [_field(member) for member in _public(obj) if member.kind.value == "attribute"]
        fields = [f for f in fields if f]
        if fields:
            parts.append("**Attributes**\n\n" + "\n".join(fields))
        for member in _public(obj):
            if member.kind.value == "function":
                parts.append(f"#### `{name}.{member.name}`")
                parts.append("```py\n" + _signature(member, member.name) + "\n```")
                parts.append(_docstring(member))
    return "\n\n".join(part for part in parts if part)


def _public(cls: Any) -> list[Any]:
    """A class's public members (its own and inherited ones it documents), in source order."""
    members = []
    for name, member in cls.all_members.items():
        member = _target(member)
        if name.startswith("_") or member.kind.value not in ("attribute", "function"):
            continue
        undocumented = (
            member.kind.value == "attribute" and "instance-attribute" in member.labels and not member.docstring
        )
        if undocumented and not _is_field(cls, member):
            continue
        members.append(member)
    return sorted(members, key=lambda m: (m.parent is not cls, m.lineno or 0))


def _target(obj: Any) -> Any:
    return obj.final_target if obj.is_alias else obj


def _is_field(cls: Any, member: Any) -> bool:
    """Whether ``member`` is a dataclass field of ``cls`` (annotated in its body: a constructor argument)."""
    dataclass = any("dataclass" in str(decorator.value) for decorator in cls.decorators)
    return dataclass and member.annotation is not None and member.parent is cls


def _field(member: Any) -> str:
    kind = f": {member.annotation}" if member.annotation is not None else ""
    default = f" = {member.value}" if member.value is not None and "property" not in member.labels else ""
    label = " (property)" if "property" in member.labels else ""
    doc = _first_paragraph(member) if member.docstring else ""
    return f"- `{member.name}{kind}{default}`{label}" + (f": {doc}" if doc else "")


def _signature(obj: Any, name: str) -> str:
    """``def name(...) -> T`` / ``class Name(...)``, one parameter a line when it would not fit."""
    function = obj
    if obj.kind.value == "class":
        function = obj.all_members.get("__init__")
        function = _target(function) if function is not None else None
    params, star = [], False
    for p in function.parameters if function is not None else ():
        if p.name in ("self", "cls"):
            continue
        kind = p.kind.value
        if kind == "keyword-only" and not star:
            params.append("*")
            star = True
        prefix = {"variadic positional": "*", "variadic keyword": "**"}.get(kind, "")
        star = star or kind == "variadic positional"
        text = f"{prefix}{p.name}" + (f": {p.annotation}" if p.annotation is not None else "")
        if p.default is not None and not prefix:
            default = _value(str(p.default), function)
            text += f" = {default}" if p.annotation is not None else f"={default}"
        params.append(text)
    if obj.kind.value == "class":
        head, tail = f"class {name}", ""
    else:
        labels = obj.labels
        head = ("async def " if "async" in labels else "def ") + name
        tail = f" -> {obj.returns}" if obj.returns is not None else ""
        if "classmethod" in labels:
            head = "@classmethod\n" + head
    one_line = f"{head}({', '.join(params)}){tail}"
    if len(one_line.splitlines()[-1]) <= SIGNATURE_COLUMNS:
        return one_line
    return f"{head}(\n" + "".join(f"    {p},\n" for p in params) + f"){tail}"


def _value(default: str, function: Any) -> str:
    """A default that names a constant of the function's module (``DEFAULT_MIN_GAP``), as its value."""
    import importlib

    if not default.isidentifier() or default in ("None", "True", "False"):
        return default
    value = getattr(importlib.import_module(function.module.path), default, None)
    return repr(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else default


def _first_paragraph(obj: Any) -> str:
    return " ".join(_markdown(obj.docstring.value).split("\n\n")[0].split())


def _docstring(obj: Any) -> str:
    return _markdown(obj.docstring.value) if obj.docstring else ""


def _markdown(text: str) -> str:
    """A docstring (reStructuredText's inline literals and ``::`` blocks) as Markdown."""
    out: list[str] = []
    lines = text.replace("``", "`").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(line.rstrip()[:-1])
            block = []
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            while block and not block[0].strip():
                block.pop(0)
            out += ["", "```text", *_dedent(block), "```", ""]
            continue
        starts_list = line.startswith(("- ", "* "))
        in_list = out and (out[-1].startswith(("- ", "* ", " ")))
        if starts_list and out and out[-1].strip() and not in_list:
            out.append("")
        out.append(line)
        i += 1
    return "\n".join(out).strip()


def _dedent(block: list[str]) -> list[str]:
    import textwrap

    return textwrap.dedent("\n".join(block)).splitlines()


def regenerate(markdown: str) -> str:
    """``markdown`` with its generated parts (between their start and end lines) written again from the code."""
    markdown = CLI_REGION.sub(lambda _: f"{CLI_MARKER}\n\n{cli_reference()}\n{CLI_END}", markdown)
    markdown = API_MARKER.sub(lambda m: f"{m.group('start')}\n\n{python_api(m.group('path'))}\n\n{API_END}", markdown)
    markdown = COLUMNS_MARKER.sub(
        lambda m: f"{m.group('start')}\n\n{training_data_columns(m.group('format'))}\n\n{COLUMNS_END}", markdown
    )
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

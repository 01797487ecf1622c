"""The generated reference covers the code: every public name, every config key.

The reference pages (docs/reference/) are generated at each ``mkdocs build`` from the code: API
entries from docstrings (mkdocstrings), the CLI from click, the config keys from
``daskjobs/daskjobs.yaml`` and its comments (docs/hooks/reference.py). What is generated cannot
drift; what can be forgotten is an entry. These tests fail when a name in the ``__all__`` of a
documented module has no ``::: name`` entry on an API page, when a key of daskjobs.yaml is
missing from the config reference or has no meaning there, and when the trace format
(docs/reference/trace-format.md, written by hand) lacks a record type or a field that the trace
reader reads. The site build itself (tests/docs/test_docs.py, ``mkdocs build --strict``) fails on an
entry that names nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from repo import ROOT

API = ROOT / "docs" / "reference" / "api"
CONFIG_PAGE = ROOT / "docs" / "reference" / "config.md"

#: Modules whose public names (``__all__``) each need an entry in docs/reference/api/.
MODULES = (
    "daskjobs",
    "daskjobs.sim",
    "daskjobs.jobs",
    "daskjobs.policies",
    "daskjobs.plugin",
    "daskjobs.replay",
    "daskjobs.cache",
    "daskjobs.trace",
)

_ENTRY = re.compile(r"^:::\s+(?P<path>[\w.]+)\s*$", re.MULTILINE)


def _hook() -> Any:
    spec = importlib.util.spec_from_file_location(
        "_reference_hook", ROOT / "docs" / "hooks" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def entries() -> set[str]:
    """Every ``::: path`` directive on the API pages."""
    found: set[str] = set()
    for page in sorted(API.glob("*.md")):
        found |= {m["path"] for m in _ENTRY.finditer(page.read_text())}
    return found


def _paths(module: str, name: str) -> set[str]:
    """The paths an entry may name ``module.name`` by: the public one, or where it is defined
    (a lazily imported name without a type stub is found by the docs build only there)."""
    obj = getattr(importlib.import_module(module), name)
    paths = {f"{module}.{name}"}
    home = getattr(obj, "__module__", None)
    if isinstance(home, str) and (isinstance(obj, type) or callable(obj)):
        paths.add(f"{home}.{name}")
    return paths


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_has_a_reference_entry(module: str) -> None:
    public = importlib.import_module(module).__all__
    have = entries()
    missing = [name for name in public if not (_paths(module, name) & have)]
    assert not missing, (
        f"{module}: public names without an entry (`::: {module}.NAME`) in docs/reference/api/: "
        f"{missing}"
    )


def test_every_entry_names_a_public_object() -> None:
    """An entry names a documented module's public name, or a module (the essays)."""
    public = {
        p for m in MODULES for name in importlib.import_module(m).__all__ for p in _paths(m, name)
    }
    stray = sorted(e for e in entries() if e not in public and e not in MODULES)
    assert not stray, f"API entries naming no public name of {MODULES}: {stray}"


def _leaf_keys(node: dict[str, Any], mappings: set[str], prefix: str = "") -> list[str]:
    out: list[str] = []
    for name, value in node.items():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(value, dict) and value and path not in mappings:
            out += _leaf_keys(value, mappings, path)
        else:
            out.append(path)
    return out


_ROW = re.compile(
    r"^\| `daskjobs\.(?P<key>[\w.-]+)` \| (?P<type>[^|]+) \| `(?P<default>.*?)` "
    r"\| (?P<meaning>.+) \|$"
)


def test_every_config_key_is_in_the_config_reference() -> None:
    hook = _hook()
    tree = yaml.safe_load((ROOT / "daskjobs" / "daskjobs.yaml").read_text())["daskjobs"]
    keys = _leaf_keys(tree, set(hook.MAPPINGS))
    assert len(keys) >= 40  # the walk found the file's keys, not an empty section
    rows = {}
    for line in hook.markdown().splitlines():
        m = _ROW.match(line)
        if m:
            rows[m["key"]] = m
    missing = [k for k in keys if k not in rows]
    assert not missing, f"daskjobs.yaml keys missing from the config reference: {missing}"
    assert set(rows) == set(keys), (
        f"keys in the reference but not in daskjobs.yaml: {set(rows) - set(keys)}"
    )
    for key, row in rows.items():
        assert row["meaning"].strip(), key
        assert row["type"].strip(), key
    assert rows["speculation.late-factor"]["type"].strip() == "number"
    assert rows["speculation.late-factor"]["default"] == "2.5"
    assert rows["jobs.lease"]["type"].strip() == "duration"
    assert rows["teams.strict"]["default"] == "false"
    # the page includes the generated tables, and the build runs the hook
    assert hook.MARKER in CONFIG_PAGE.read_text()
    assert "docs/hooks/reference.py" in (ROOT / "mkdocs.yml").read_text()


def test_a_key_without_a_meaning_or_a_type_fails_the_build(tmp_path: Path) -> None:
    hook = _hook()
    good = tmp_path / "good.yaml"
    good.write_text(
        "daskjobs:\n  # The answer.\n  answer: 42\n  part:\n    # On or off.\n    flag: true\n"
        "    # How long.\n    wait: 30s\n"
    )
    assert [(k.path, k.type, k.default, k.meaning) for k in hook.keys(good)] == [
        ("answer", "integer", "42", "The answer."),
        ("part.flag", "boolean", "true", "On or off."),
        ("part.wait", "duration", "30s", "How long."),
    ]
    bare = tmp_path / "bare.yaml"
    bare.write_text("daskjobs:\n  # The answer.\n  answer: 42\n\n  question: why\n")
    with pytest.raises(ValueError, match=r"daskjobs\.question: no comment"):
        hook.keys(bare)
    null = tmp_path / "null.yaml"
    null.write_text("daskjobs:\n  # Somewhere.\n  somewhere: null\n")
    with pytest.raises(ValueError, match=r"daskjobs\.somewhere: the default is null"):
        hook.keys(null)


def test_sphinx_roles_are_dropped_from_rendered_docstrings() -> None:
    hook = _hook()
    html = "see :class:<code>~daskjobs.sim.Task</code> and :func:<code>simulate</code>; a:b"
    assert hook.on_page_content(html) == (
        "see <code>daskjobs.sim.Task</code> and <code>simulate</code>; a:b"
    )


# -- the trace format (docs/reference/trace-format.md) against its reader (daskjobs/trace.py) ------


def _fields_read(function: Any) -> set[str]:
    """The fields a reader method reads: the string literals of its ``line.get(NAME, ...)``."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "line"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def _trace_sections() -> dict[str, str]:
    """Record type -> the text of its section in docs/reference/trace-format.md (``### `type`
    ...``)."""
    text = (ROOT / "docs" / "reference" / "trace-format.md").read_text()
    sections: dict[str, str] = {}
    parts = re.split(r"^### ", text, flags=re.MULTILINE)
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        for name in re.findall(r"`([a-z-]+)`", heading.split(":")[0]):
            sections[name] = body.split("\n## ")[0]
    return sections


def _named(field: str, section: str) -> bool:
    """A field is documented when its section names it as code or as a JSON key."""
    return f"`{field}`" in section or f'"{field}":' in section


def test_every_record_type_and_field_the_reader_reads_is_in_the_trace_format() -> None:
    from daskjobs import trace

    sections = _trace_sections()
    types = {*trace._HANDLERS, "header", "footer"}
    assert not types - set(sections), (
        f"record types missing from docs/reference/trace-format.md: {types - set(sections)}"
    )
    missing = {
        name: sorted(f for f in _fields_read(method) if not _named(f, sections[name]))
        for name, method in trace._HANDLERS.items()
    }
    missing.update(
        header=sorted(
            f for f in _fields_read(trace._Reader.header) if not _named(f, sections["header"])
        ),
        footer=sorted(
            f for f in _fields_read(trace._Reader.footer) if not _named(f, sections["footer"])
        ),
    )
    assert not any(missing.values()), (
        f"fields the reader reads, missing from docs/reference/trace-format.md: {missing}"
    )
    assert "deps" in _fields_read(trace._Reader.graph)  # the scan finds what it should

"""MkDocs hook: the configuration reference, generated from ``daskjobs/daskjobs.yaml``.

The YAML of defaults is the one place a default is written (daskjobs/_defaults.py), and its
comments say what each key means. This hook reads the file, keys and comments alike, and puts
a table of every ``daskjobs.*`` key (its type, its default, its meaning) where
``docs/reference/config.md`` holds the marker ``<!-- daskjobs-config-keys -->``. A key added
to the YAML appears in the reference at the next build; a key without a comment, or one whose
type cannot be told, fails the build (and tests/docs/test_reference.py).

Why a hook and not a page written by a script: nothing generated is committed, so nothing can
be stale; ``mkdocs build`` and ``mkdocs serve`` run it, with no step to forget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "daskjobs" / "daskjobs.yaml"
MARKER = "<!-- daskjobs-config-keys -->"
PAGE = "reference/config.md"

#: The type of a key whose default is ``null`` (the default says nothing about it). A new key
#: with a null default fails the build until it is named here.
NULL_TYPES = {
    "history.path": "path or null",
    "record": "path or null",
    "record-dir": "path or null",
    "store": "path or fsspec URL, or null",
    "inventory": "mapping or null",
    "ledger.url": "SQLAlchemy URL or null",
    "team": "team name or null",
}
#: Keys whose value is a mapping the user fills in (not a section of further keys).
MAPPINGS = {"policy-options", "teams.targets", "teams.quotas", "teams.identities", "inventory"}

_DURATION = re.compile(r"^\d+(\.\d+)?\s*(us|ms|s|m|h|d)$")
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[a-z][a-z0-9-]*):(?P<rest>.*)$")


@dataclass(frozen=True)
class Key:
    """One ``daskjobs.*`` key: its dotted path, type, default as written, and meaning."""

    path: str  # without the leading "daskjobs."
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Section:
    """A group of keys under one mapping (``""`` for the top level), with its own comment."""

    path: str
    about: str
    keys: tuple[Key, ...]


def _comments(text: str) -> dict[str, str]:
    """dotted key -> the comment block just above it (consecutive ``#`` lines)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        m = _KEY.match(line)
        if not m:
            block = []
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(name for _, name in stack), m["key"]])
        out[path] = " ".join(block)
        block = []
        stack.append((indent, m["key"]))
    return out


def _type(path: str, value: Any) -> str:
    if value is None:
        if path not in NULL_TYPES:
            raise ValueError(
                f"daskjobs.{path}: the default is null; name its type in "
                "docs/hooks/reference.py NULL_TYPES"
            )
        return NULL_TYPES[path]
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, str):
        return "duration" if _DURATION.match(value) else "string"
    if isinstance(value, list):
        return "list"
    raise ValueError(f"daskjobs.{path}: a default of type {type(value).__name__}")


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{}" if not value else yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def sections(path: Path = YAML) -> list[Section]:
    """Every key of the YAML's ``daskjobs`` section, grouped by the mapping that holds it."""
    text = path.read_text(encoding="utf-8")
    comments = _comments(text)
    tree = yaml.safe_load(text)["daskjobs"]
    found: list[Section] = []

    def walk(prefix: str, node: dict[str, Any]) -> None:
        keys: list[Key] = []
        nested: list[tuple[str, dict[str, Any]]] = []
        for name, value in node.items():
            dotted = f"{prefix}.{name}" if prefix else name
            if isinstance(value, dict) and dotted not in MAPPINGS:
                nested.append((dotted, value))
                continue
            meaning = comments.get(f"daskjobs.{dotted}", "")
            if not meaning and name == "enabled" and prefix:
                # a section's switch: the section's own comment says what it turns on
                meaning = f"Turns on what `daskjobs.{prefix}` does (above)."
            if not meaning:
                raise ValueError(f"daskjobs.{dotted}: no comment above it in daskjobs.yaml")
            keys.append(Key(dotted, _type(dotted, value), _shown(value), meaning))
        about = comments.get(f"daskjobs.{prefix}", "") if prefix else ""
        found.append(Section(prefix, about, tuple(keys)))
        for dotted, value in nested:
            walk(dotted, value)

    walk("", tree)
    return found


def keys(path: Path = YAML) -> list[Key]:
    """Every leaf key, in file order within each section."""
    return [k for s in sections(path) for k in s.keys]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(path: Path = YAML) -> str:
    """The tables the reference page shows, one per section."""
    out: list[str] = []
    for s in sections(path):
        if s.path:
            out += [f"## `daskjobs.{s.path}`", ""]
            if s.about:
                out += [_cell(s.about), ""]
        else:
            out += ["## `daskjobs`", "", "The keys at the top of the section.", ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for k in s.keys:
            out.append(
                f"| `daskjobs.{k.path}` | {k.type} | `{_cell(k.default)}` | {_cell(k.meaning)} |"
            )
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown_text: str, page: Any, **kwargs: Any) -> str:
    """Fill the config reference's marker (MkDocs calls this for every page)."""
    if page.file.src_uri != PAGE:
        return markdown_text
    if MARKER not in markdown_text:
        raise ValueError(f"{PAGE}: the marker {MARKER} is missing")
    return markdown_text.replace(MARKER, markdown())


#: Sphinx roles in docstrings (``:class:`Foo```), which Markdown shows as text before the code.
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|ref):<code>~?")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Drop the Sphinx role names (and their ``~``) left in front of code in docstrings
    rendered as Markdown."""
    return _ROLE.sub("<code>", html)

"""The documentation site's shape: the pages a user comes for, and no work log among them.

``mkdocs build --strict`` (tests/docs/test_docs.py) fails on a page left out of the nav, not on a
nav that lost its tutorial or a how-to page. These tests read mkdocs.yml's ``nav`` and check
that it holds the four kinds of page the way the dask and numpy docs sort them (Diataxis): the
tutorial; the how-to pages users come with; the reference generated from the code (an API page
per documented module, the CLI from click, the config keys from daskjobs.yaml, the trace
format); and the explanation pages, among them an essay per policy module. Then that no page
in the nav, and no module of the package, reads as a work log: dated headings or entries, a
session's span of hours, issue numbers, parts of a session. Those go to benchmarks/NOTES.md
(a dated log) and to commit messages; docs/benchmarks.md shows current figures, each with the
date and command that produced it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from repo import ROOT

DOCS = ROOT / "docs"

#: nav section -> pages it must hold (paths under docs/).
REQUIRED = {
    "Tutorial": ["tutorial.md"],
    "How-to guides": [
        "how-to/teams.md",  # set up teams and quotas
        "how-to/backup-copies.md",
        "how-to/choose-a-policy.md",  # by replay
        "how-to/ml-jobs.md",  # with a ledger
        "how-to/interactive-first.md",
        "how-to/gangs.md",
        "how-to/deploy.md",  # on Slurm or Kubernetes
        "how-to/recover.md",  # after a scheduler loss
    ],
    "Reference": [
        "reference/api/daskjobs.md",
        "reference/api/sim.md",
        "reference/api/jobs.md",
        "reference/api/policies.md",
        "reference/cli.md",
        "reference/config.md",
        "reference/trace-format.md",
    ],
    "Explanation": [
        "explanation/architecture.md",
        "explanation/policies.md",
        "explanation/simulator.md",
        "explanation/trust.md",
    ],
}

#: Modules of daskjobs/policies whose essay is not on explanation/policies.md, and why.
NOT_AN_ESSAY = {
    "daskjobs.policies": "the package: its names are the API page",
    "daskjobs.policies.registry": "names to policies, not a policy: the API page shows it",
}


def nav() -> dict[str, list[str]]:
    """Top-level nav title -> every page under it (a page alone is its own section)."""

    def pages(node: Any) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in pages(value)]
        raise TypeError(node)

    sections: dict[str, list[str]] = {}
    for item in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]:
        ((title, value),) = item.items()
        sections[title] = pages(value)
    return sections


def test_the_nav_holds_the_four_kinds_of_page() -> None:
    sections = nav()
    missing = {
        title: [p for p in want if p not in sections.get(title, [])]
        for title, want in REQUIRED.items()
    }
    assert not any(missing.values()), f"pages missing from mkdocs.yml's nav: {missing}"
    for page in (p for ps in sections.values() for p in ps):
        assert (DOCS / page).is_file(), f"the nav names {page}, which does not exist"


#: nav section -> the folder of docs/ its pages live in.
FOLDER = {"How-to guides": "how-to", "Reference": "reference", "Explanation": "explanation"}
#: Pages that stay at docs/'s root whatever their section, and why.
AT_THE_ROOT = {
    "benchmarks.md": "the figures page every benchmark and the house rules name by its path",
    "changelog.md": "a project's changelog is looked for at the top of its docs",
}


def test_each_page_lives_in_the_folder_its_nav_section_names() -> None:
    misplaced = [
        f"{page} (under {title!r}: expected in {FOLDER[title]}/)"
        for title, pages in nav().items()
        if title in FOLDER
        for page in pages
        if not page.startswith(FOLDER[title] + "/") and page not in AT_THE_ROOT
    ]
    assert not misplaced, "pages outside their section's folder:\n" + "\n".join(misplaced)


def test_the_how_to_pages_cover_what_they_are_named_for() -> None:
    deploy = (DOCS / "how-to" / "deploy.md").read_text().lower()
    headings = [line for line in deploy.splitlines() if line.startswith("## ")]
    assert any("slurm" in h for h in headings) and any("kubernetes" in h for h in headings)


def test_the_reference_pages_are_generated_from_the_code() -> None:
    for name in ("daskjobs", "sim", "jobs", "policies"):
        text = (DOCS / "reference" / "api" / f"{name}.md").read_text()
        assert len(re.findall(r"^::: daskjobs[\w.]*$", text, re.MULTILINE)) >= 5, name
    assert "::: mkdocs-click" in (DOCS / "reference" / "cli.md").read_text()
    assert "<!-- daskjobs-config-keys -->" in (DOCS / "reference" / "config.md").read_text()


def test_every_policy_module_has_its_essay_on_the_explanation_page() -> None:
    shown = set(
        re.findall(r"^::: ([\w.]+)$", (DOCS / "explanation" / "policies.md").read_text(), re.M)
    )
    modules = {
        "daskjobs.policies" + ("" if p.stem == "__init__" else f".{p.stem}")
        for p in (ROOT / "daskjobs" / "policies").glob("*.py")
    }
    assert len(modules) >= 10
    missing = sorted(modules - shown - set(NOT_AN_ESSAY))
    assert not missing, f"policy modules without their essay on explanation/policies.md: {missing}"
    assert not shown - modules, f"essays of no policy module: {shown - modules}"


# -- no work log -----------------------------------------------------------------------------

_WORDS = "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
#: What a work log looks like, and no page does.
LOG = {
    "a dated heading": re.compile(r"^#+ .*\b20\d\d-\d\d-\d\d", re.M),
    "an entry opening with a date": re.compile(r"^\s*(?:[-*]\s+)?\**20\d\d-\d\d-\d\d\b", re.M),
    "a session's span of hours": re.compile(r"\b\d{1,2}:\d\d\s*[-\u2013]\s*\d{1,2}:\d\d\b"),
    "an issue number": re.compile(r"\bissues? #?\d+\b", re.I),
    "a part of a session": re.compile(
        rf"\bpart (?:{_WORDS})\b|\(in progress\)",  # a job's "last part" is a job's
        re.I,
    ),
    "a work session": re.compile(
        rf"\b(?:work|this|last|next) session\b|\bsession (?:\d+|{_WORDS})\b", re.I
    ),
}
_FENCE = re.compile(r"^(\s*)(```|~~~).*?^\1\2\s*$", re.M | re.S)


def log_lines(text: str) -> list[str]:
    """The lines of ``text`` (fenced blocks left out: sample output) that read as a log."""
    prose = _FENCE.sub("", text)
    found = []
    for what, pattern in LOG.items():
        for m in pattern.finditer(prose):
            line = prose[prose.rfind("\n", 0, m.start()) + 1 : prose.find("\n", m.end())]
            found.append(f"{what}: {line.strip()[:120]}")
    return found


def test_the_log_scan_finds_a_log() -> None:
    assert len(log_lines((ROOT / "benchmarks" / "NOTES.md").read_text())) >= 10
    sample = (
        "### The grid again (2026-12-01, 03:00-04:20 UTC)\n"
        "- 2026-12-02: tried a heap\n"
        "Changelog, part one; the rest in part two (in progress).\n"
        "Done in issue 16, work session 3.\n"
        "```text\n2026-12-03 07:16:24,912 - daskjobs.plugin - INFO - a log line\n```\n"
    )
    kinds = {line.split(":")[0] for line in log_lines(sample)}
    assert kinds == set(LOG), kinds
    # a date beside a current figure, and a sample log line in a block, are not a log
    assert not log_lines("Measured 2026-11-30 at 7696d93 (`python benchmarks/bench_x.py`).\n")


def test_no_page_in_the_nav_holds_a_work_log() -> None:
    pages = [p for ps in nav().values() for p in ps]
    found = [f"docs/{p}: {line}" for p in pages for line in log_lines((DOCS / p).read_text())]
    assert not found, "work-log lines on the docs site:\n" + "\n".join(found)


def test_no_module_of_the_package_holds_a_work_log() -> None:
    found = []
    for path in sorted((ROOT / "daskjobs").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = log_lines(text) + [
            f"a date: {m.group(0)}" for m in re.finditer(r"\b20\d\d-\d\d-\d\d\b", text)
        ]
        found += [f"{path.relative_to(ROOT)}: {line}" for line in lines]
    assert not found, "work-log lines in daskjobs/:\n" + "\n".join(found)

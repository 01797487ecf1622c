"""The fenced blocks of docs/how-to/deploy.md, read by the tests that run its recipes."""

from __future__ import annotations

import re

from repo import ROOT

PAGE = ROOT / "docs" / "how-to" / "deploy.md"


def blocks(lang: str) -> list[str]:
    """The page's fenced blocks of one language, in order."""
    found = re.findall(rf"^```{lang}\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)
    assert found, f"no {lang} block in {PAGE}"
    return found


def block(lang: str, first_line: str) -> str:
    (found,) = [b for b in blocks(lang) if b.startswith(first_line) or first_line in b]
    return found

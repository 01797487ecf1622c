"""No function in ``daskjobs/`` is longer than a reader can hold: :data:`LIMIT` lines.

The house style ("Functions a reader can hold"): distributed's longest
function in its scheduler, stealing, worker state machine and memory manager is about 110
lines. A loop that must be one long function for speed is one kernel, said so and
compared with a reference path; everything around it has names. This test is that rule
made executable, the way tests/project/test_layering.py fences the imports: an AST walk of every
module under ``daskjobs/`` that names each function or method (nested ones included)
longer than :data:`LIMIT`, with its file and length.

A function's length is its lines from ``def`` to its last line (``end_lineno - lineno +
1``): docstring, comments and blank lines in it included, decorators not. Names are
qualified as Python's ``__qualname__`` (``Speculation.decide``, ``f.<locals>.g``).

:data:`ALLOWED` lists the functions still allowed past the limit, each capped at its
length when it was listed: the test fails if one grows, and an entry no longer needed
(the function gone, or back under the limit) fails :func:`test_every_allowance_is_still_needed`
until its line is removed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import daskjobs

ROOT = Path(daskjobs.__file__).resolve().parent

#: The longest a function may be, in lines (``def`` to its last line).
LIMIT = 150

#: (file, qualified name) -> the most lines the function may have: the functions allowed
#: past :data:`LIMIT`, each capped at its length when it was listed (lower a cap as the
#: function shrinks; remove its line once it is under the limit).
ALLOWED: dict[tuple[str, str], int] = {
    # The simulator's kernel: its event loop is one method for speed (hot names bound to
    # locals, the plain paths of a start and an end inlined), compared event for event with
    # the engine's reference path (tests/sim/test_sim_reference.py). At most 400 lines.
    ("daskjobs/sim/engine.py", "_Engine.kernel"): 306,
}


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of every function and method in
    ``source``, nested ones included, in source order."""
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                assert child.end_lineno is not None
                out.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def package_functions() -> dict[tuple[str, str], tuple[int, int]]:
    """(file as ``daskjobs/...``, qualified name) -> (first line, length) of every function
    and method in the package."""
    found: dict[tuple[str, str], tuple[int, int]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        for name, line, length in function_lengths(path.read_text(encoding="utf-8")):
            found[(rel, name)] = (line, length)
    return found


def too_long(
    functions: dict[tuple[str, str], tuple[int, int]],
    limit: int = LIMIT,
    allowed: dict[tuple[str, str], int] | None = None,
) -> list[str]:
    """What breaks the rule, one line each: a function over ``limit`` that is not
    ``allowed``, or an allowed one over its cap."""
    allowed = ALLOWED if allowed is None else allowed
    out = []
    for (rel, name), (line, length) in sorted(functions.items()):
        cap = allowed.get((rel, name))
        if cap is not None and length > cap:
            out.append(
                f"{rel}:{line}: {name} is {length} lines, over its allowance of {cap} "
                "(ALLOWED in tests/project/test_house_rules.py): it may shrink, not grow"
            )
        elif cap is None and length > limit:
            out.append(
                f"{rel}:{line}: {name} is {length} lines, over {limit}: give its parts names "
                "(helpers, methods) a reader can hold"
            )
    return out


def test_no_function_in_the_package_is_over_the_limit() -> None:
    problems = too_long(package_functions())
    assert not problems, "\n".join(problems)


def test_every_allowance_is_still_needed() -> None:
    functions = package_functions()
    stale = []
    for (rel, name), cap in ALLOWED.items():
        got = functions.get((rel, name))
        if got is None:
            stale.append(f"{rel}: no function {name}: remove its line from ALLOWED")
        elif got[1] <= LIMIT:
            stale.append(f"{rel}: {name} is {got[1]} lines, within {LIMIT}: remove its line")
        if cap <= LIMIT:
            stale.append(f"{rel}: {name}'s allowance of {cap} is within {LIMIT}: remove its line")
    assert not stale, "\n".join(stale)


# -- the checker's own tests -----------------------------------------------------------------


def _source(body_lines: int, indent: str = "    ") -> list[str]:
    return [f"{indent}x = {i}" for i in range(body_lines)]


def test_the_walk_names_functions_methods_and_nested_functions_with_their_lengths() -> None:
    source = "\n".join(
        [
            "def f():",  # line 1
            "    def g():",
            "        pass",
            "    return g",
            "class C:",  # line 5
            "    @staticmethod",
            "    def m():",
            "        pass",
            "    class D:",
            "        async def n(self):",  # line 10
            "            pass",
            "",
            "            return 1",
            "if True:",
            "    def h():",  # line 15
            "        pass",
        ]
    )
    assert function_lengths(source) == [
        ("f", 1, 4),
        ("f.<locals>.g", 2, 2),
        ("C.m", 7, 2),  # from def, not from its decorator
        ("C.D.n", 10, 4),
        ("h", 15, 2),
    ]


def test_the_rule_flags_a_function_one_line_over_and_an_allowed_one_that_grew() -> None:
    source = "\n".join(["def at():", *_source(LIMIT - 1), "def over():", *_source(LIMIT)])
    functions = {("daskjobs/x.py", n): (line, k) for n, line, k in function_lengths(source)}
    assert functions[("daskjobs/x.py", "at")][1] == LIMIT
    problems = too_long(functions, allowed={})
    assert problems == [
        f"daskjobs/x.py:{LIMIT + 1}: over is {LIMIT + 1} lines, over {LIMIT}: give its parts "
        "names (helpers, methods) a reader can hold"
    ]
    assert too_long(functions, allowed={("daskjobs/x.py", "over"): LIMIT + 1}) == []
    grew = too_long(functions, allowed={("daskjobs/x.py", "over"): LIMIT})
    assert len(grew) == 1 and f"over its allowance of {LIMIT}" in grew[0]

"""One tolerance table and one longest row: ``harness/checks/policy.py`` defines every tolerance the checker
holds a gap to and the longest row it feeds (``LONGEST_ROW``); no other checker module writes its own.

The check reads the source (AST, no import): comments and docstrings never count. Outside
``harness/checks/policy.py`` it fails on

* a float literal passed as ``atol=``, ``rtol=``, ``abs_tol=`` or ``rel_tol=``, or as the third or later
  positional argument of an ``allclose`` / ``isclose`` / ``assert_close`` call;
* a float literal between :data:`LOW` and :data:`HIGH` (the size of a tolerance) inside a comparison
  (``err > 1e-6``, ``g <= max(t, 1e-3 * s)``);
* a name that reads as a tolerance (``ATOL``, ``gate_rtol``, ``threshold``, ``LIMIT``) assigned such a literal;
* a ``LONGEST_*`` name assigned anywhere in ``harness/`` (not only the checks).

An eps inside a formula (``sqrt(var + 1e-5)``) or a division guard (``clamp_min(1e-300)``) is neither.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from harness.checks import policy
from harness.config import PRESETS
from harness.tasks import base as task_base

from .conftest import ROOT

#: The size of a float literal that looks like a tolerance when it sits in a comparison.
LOW, HIGH = 1e-15, 1e-3
TOL_KEYWORDS = frozenset({"atol", "rtol", "abs_tol", "rel_tol"})
CLOSE_CALLS = frozenset({"allclose", "isclose", "assert_close"})
TOL_NAME = re.compile(r"tol|thresh|^thr$|limit", re.IGNORECASE)
POLICY = "harness/checks/policy.py"


def _floats(node: ast.AST) -> list[float]:
    """The float literals in ``node``'s subtree (``-1e-5`` counts as 1e-5)."""
    return [abs(n.value) for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, float) and n.value != 0.0]


def _sized(node: ast.AST) -> list[float]:
    return [v for v in _floats(node) if LOW <= v <= HIGH]


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _targets(node: ast.AST) -> list[str]:
    """Names an assignment binds (tuples unpacked)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _node_problems(node: ast.AST) -> list[str]:
    """What one node does that only policy.py may do."""
    out = []
    if isinstance(node, ast.keyword) and node.arg in TOL_KEYWORDS and _floats(node.value):
        out.append(f"{node.arg}={_floats(node.value)[0]:g}")
    elif isinstance(node, ast.Call) and _call_name(node) in CLOSE_CALLS:
        out += [f"{_call_name(node)}(..., {v:g})" for arg in node.args[2:] for v in _floats(arg)]
    elif isinstance(node, ast.Compare) and _sized(node):
        out.append(f"comparison with {_sized(node)[0]:g}")
    elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        names = _targets(node)
        out += [f"defines {n}" for n in names if n.startswith("LONGEST_")]
        if _sized(node.value):
            out += [f"{n} = {_sized(node.value)[0]:g}" for n in names if TOL_NAME.search(n)]
    return out


def policy_violations(root: Path) -> list[str]:
    """``path:line: what`` for every tolerance literal or ``LONGEST_*`` definition outside policy.py, in
    ``root``'s ``harness/checks/*.py`` (and ``LONGEST_*`` definitions anywhere in ``root``'s ``harness/``)."""
    found = []
    for path in sorted((root / "harness").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == POLICY:
            continue
        in_checks = path.parent == root / "harness" / "checks"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            problems = _node_problems(node)
            if not in_checks:
                problems = [p for p in problems if p.startswith("defines LONGEST_")]
            found += [f"{rel}:{getattr(node, 'lineno', '?')}: {p}" for p in problems]
    return found


def test_no_checker_module_but_policy_writes_a_tolerance_or_a_longest_row():
    assert policy_violations(ROOT) == []


def test_the_check_flags_planted_tolerances_and_longest_rows(tmp_path):
    checks = tmp_path / "harness" / "checks"
    checks.mkdir(parents=True)
    (tmp_path / "harness" / "model.py").write_text("LONGEST_CONTEXT = 4096\nrtol = 1e-4  # not the checks\n")
    (checks / "contract_new.py").write_text(
        '"""Compares within atol=1e-6 (a docstring: not counted)."""\n'
        "import math\nimport torch\n"
        "ATOL = 1e-5\n"
        "LONGEST_ROWS = 128\n"
        "def f(a, b, err, x):\n"
        "    # if err > 1e-6: a comment, not counted\n"
        "    y = torch.sqrt(x.var(-1) + 1e-5)  # an eps: not a tolerance\n"
        "    z = x / x.sum().clamp_min(1e-300)\n"
        "    if torch.allclose(a, b, atol=1e-6):\n"
        "        return 1\n"
        "    if torch.isclose(a, b, 1e-4, 1e-6).all():\n"
        "        return 2\n"
        "    if math.isclose(err, 1.0, rel_tol=1e-9):\n"
        "        return 3\n"
        "    return err > -1e-6 or err <= max(y, 1e-3 * float(z.max()))\n")
    (checks / "policy.py").write_text("LONGEST_ROW = 64\nGATE_ATOL = 1e-5\nok = abs(GATE_ATOL) < 1e-3\n")
    assert sorted(policy_violations(tmp_path)) == [
        "harness/checks/contract_new.py:10: atol=1e-06",
        "harness/checks/contract_new.py:12: isclose(..., 0.0001)",
        "harness/checks/contract_new.py:12: isclose(..., 1e-06)",
        "harness/checks/contract_new.py:14: rel_tol=1e-09",
        "harness/checks/contract_new.py:16: comparison with 0.001",
        "harness/checks/contract_new.py:16: comparison with 1e-06",
        "harness/checks/contract_new.py:4: ATOL = 1e-05",
        "harness/checks/contract_new.py:5: defines LONGEST_ROWS",
        "harness/model.py:1: defines LONGEST_CONTEXT",
    ]


def test_the_longest_row_covers_every_preset():
    """``LONGEST_ROW`` caps a check only where ``max_len`` exceeds it: at every preset the checks feed the whole
    row the run trains on."""
    assert all(cfg.model.max_len <= policy.LONGEST_ROW for cfg in PRESETS.values())


def test_the_task_leak_test_holds_the_gate_pair():
    """``harness.tasks`` sits below the checks and cannot import policy.py: its pair must equal the gate's."""
    assert (task_base.LEAK_ATOL, task_base.LEAK_RTOL) == (policy.GATE_ATOL, policy.GATE_RTOL)

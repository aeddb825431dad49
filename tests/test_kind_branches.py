"""Branches on finding-kind strings outside the diagnoses themselves, as a ratchet (issue #27 item 2).

A diagnosis owns what is particular to it (how it runs, merges, flags, plans, its not-applicable text,
its report section) through its :class:`precnb.analysis.registry.Diagnosis` hooks. A comparison with a
registered kind's string (``f.kind == "anomaly"``, ``"preflight" in kinds``) elsewhere in the package is
a place a new diagnosis cannot reach: the count of those may only go down. When you remove one, lower
:data:`CAP` (the test fails when the count is below it, so the cap follows).

Beyond comparisons, any string literal equal to a registered kind outside its diagnosis (the registering module and
the family that makes its findings, :data:`FAMILIES`) is counted (issue #50 item 2): a front end imports the kind's
constant (``precnb.analysis.diagnoses.PREFLIGHT``, ``precnb.analysis.spike.diagnosis.LOSS_SPIKE``) or asks the
registry (a hook group); what is left (:data:`NAMES`) are names that equal a kind without being one.
"""

from __future__ import annotations

import ast

from precnb.analysis import registry
from tests.conftest import ROOT

#: comparisons with a registered kind's string left outside the diagnoses (see the module docstring)
CAP = 0


def _exempt() -> set[str]:
    """The registry and the modules that register diagnoses (a diagnosis may name itself)."""
    mods = {"precnb.analysis.registry", *registry.BUILTIN_MODULES}
    mods |= {d.run.__module__ for d in registry.diagnoses()}
    return {m.replace(".", "/") + ".py" for m in mods}


def _names_kind(node: ast.AST, kinds: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in kinds
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_kind(e, kinds) for e in node.elts)
    return False


def kind_branches() -> list[str]:
    """``path:line: comparison`` for every comparison with a built-in kind's string outside the diagnoses."""
    kinds = {d.kind for d in registry.diagnoses()}
    exempt = _exempt()
    out = []
    for path in sorted((ROOT / "precnb").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(_names_kind(x, kinds) for x in (node.left, *node.comparators)):
                out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return sorted(out)


def test_counter_sees_a_kind_branch() -> None:
    tree = ast.parse("if f.kind == 'nan_origin' or 'anomaly' in kinds or k == 'other': pass")
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
            and any(_names_kind(x, {"nan_origin", "anomaly"}) for x in (n.left, *n.comparators))]
    assert len(hits) == 2


def test_kind_branches_only_go_down() -> None:
    found = kind_branches()
    assert len(found) <= CAP, "new branch(es) on a finding kind: give the Diagnosis a hook instead\n" + "\n".join(found)
    assert len(found) == CAP, f"{CAP - len(found)} branch(es) fewer: lower CAP to {len(found)} in this test"


#: each built-in kind's family: the analysis package that makes its findings (a diagnosis may name itself there)
FAMILIES = {"preflight": "precnb/analysis/preflight/", "first_divergence": "precnb/analysis/divergence/",
            "replica_mismatch": "precnb/analysis/replicas/", "nan_origin": "precnb/analysis/nan/",
            "anomaly": "precnb/analysis/anomalies/", "loss_spike": "precnb/analysis/spike/"}
#: strings equal to a kind left outside the diagnoses (issue #50 item 2), each a name that is not a kind: the
#: public functions ``precnb.first_divergence`` / ``nan_origin`` / ``preflight`` (lazy API maps, ``__all__``), the
#: report template's ``preflight`` section, the ``nan_origin`` notebook template
NAMES = {"precnb/__init__.py": 3, "precnb/analysis/__init__.py": 4, "precnb/pipeline/run.py": 1,
         "precnb/report/html.py": 1, "precnb/report/notebooks.py": 1}


def kind_literals() -> dict[str, list[str]]:
    """``path -> ["line: 'kind'", ...]``: every string literal equal to a registered kind outside its diagnosis."""
    kinds = {d.kind for d in registry.diagnoses()}
    exempt = _exempt()
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "precnb").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in kinds \
                    and not rel.startswith(FAMILIES.get(node.value, "-")):
                out.setdefault(rel, []).append(f"{node.lineno}: {node.value!r}")
    return out


def test_kind_literals_only_go_down() -> None:
    """Any string equal to a registered kind, outside its diagnosis (module and family): only the names listed."""
    found = kind_literals()
    extra = {p: v for p, v in found.items() if len(v) > NAMES.get(p, 0)}
    assert not extra, f"a kind spelled out: import its constant (precnb.analysis.diagnoses.PREFLIGHT, ...)\n{extra}"
    fewer = {p: n for p, n in NAMES.items() if len(found.get(p, [])) < n}
    assert not fewer, f"fewer names equal to a kind: lower NAMES {fewer}"
    assert sum(NAMES.values()) == 10

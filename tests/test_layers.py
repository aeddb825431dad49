"""The import contracts of pyproject.toml ``[tool.importlinter]`` hold on the package, and they can fail.

``lint-imports`` (import-linter) checks the whole import graph: the layers of DESIGN.md (front ends
independent, io and analysis independent, nothing importing the root package), the layers inside
``precnb.analysis`` (the families over the modules they share, no lazy import reaching up), viz pure, the core
free of the notebook stack, torch/msprobe/MindSpore only in the generator and the tensor loader.
The second test copies the package, adds one forbidden import per contract and a module no layer
lists (at the root and in ``precnb.analysis``), and checks that each contract is reported broken naming the import.
"""

from __future__ import annotations

import ast
import graphlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.is_file():
        pytest.fail(f"{LINT_IMPORTS} missing: import-linter is in the [test] extra (pip install -e '.[test]')")
    # cwd first on sys.path (lint-imports puts it there): the package analysed is the one in cwd
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(cwd / "pyproject.toml")],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_import_contracts_hold():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    contracts = _contracts()
    assert set(contracts) == {"layers", "analysis-layers", "viz-pure", "core-without-notebook", "generator-deps",
                              "no-msprobe-mindspore"}
    for c in contracts.values():
        assert f"{c['name']} KEPT" in " ".join(proc.stdout.split()), c["name"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in proc.stdout
    layers = contracts["layers"]
    assert layers["exhaustive"] and not layers.get("ignore_imports") and not layers.get("exhaustive_ignores")
    flat = [m.strip() for layer in layers["layers"] for m in layer.replace(":", "|").split("|")]
    assert flat.index("cli") < flat.index("widgets") < flat.index("pipeline") < flat.index("analysis")
    assert layers["layers"][-1] == "errors | schema"  # both import nothing of precnb
    inner = contracts["analysis-layers"]
    assert inner["containers"] == ["precnb.analysis"] and inner["exhaustive"]
    assert not inner.get("ignore_imports") and not inner.get("exhaustive_ignores")
    assert not any(":" in layer for layer in inner["layers"])  # no two children of analysis import each other
    flat = [m.strip() for layer in inner["layers"] for m in layer.split("|")]
    assert flat[0] == "diagnoses"  # registers every family
    assert flat.index("nan") < flat.index("divergence") < flat.index("findings") < flat.index("layout") < flat.index(
        "causal") < flat.index("events") < flat.index("masks")


# one injected line per contract: (file, line, contract id, what the broken contract must say)
INJECTIONS = [
    ("io/_fs.py", "import precnb.widgets", "layers", "precnb.io is not allowed to import precnb.widgets"),
    ("analysis/masks.py", "import precnb.io.api", "layers", "precnb.analysis is not allowed to import precnb.io"),
    ("analysis/masks.py", "import precnb.analysis.divergence", "analysis-layers",
     "precnb.analysis.masks is not allowed to import precnb.analysis.divergence"),
    ("report/_tables.py", "import precnb.widgets.findings", "layers",
     "precnb.report is not allowed to import precnb.widgets"),
    ("combine/__init__.py", "from precnb import open_run", "layers",
     "precnb.combine is not allowed to import precnb._xarray_hook"),
    ("schema/_core.py", "import precnb.naming", "layers", "precnb.schema is not allowed to import precnb.naming"),
    ("viz/frames.py", "import precnb.io.tensors", "viz-pure", "precnb.viz is not allowed to import precnb.io"),
    ("pipeline/inputs.py", "import altair", "core-without-notebook", "precnb.pipeline is not allowed to import altair"),
    ("analysis/summary.py", "import torch", "generator-deps", "precnb.analysis.summary -> torch"),
    ("io/mindspore/statistic.py", "import mindspore", "no-msprobe-mindspore",
     "precnb.io.mindspore.statistic -> mindspore"),
]


def test_each_contract_fails_on_a_forbidden_import(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    pkg = tmp_path / "precnb"
    shutil.copytree(ROOT / "precnb", pkg, ignore=shutil.ignore_patterns("__pycache__", "data_samples"))
    clean = _lint(tmp_path)
    assert clean.returncode == 0, clean.stdout[-4000:]  # the copy is analysed like the checkout
    for rel, line, _, _ in INJECTIONS:
        path = pkg / rel
        path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # noqa\n", encoding="utf-8")
    (pkg / "newmodule.py").write_text('"""A module no layer lists."""\n', encoding="utf-8")
    (pkg / "analysis" / "newmodule.py").write_text('"""A module no layer lists."""\n', encoding="utf-8")
    proc = _lint(tmp_path)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    contracts = _contracts()
    assert f"Contracts: 0 kept, {len(contracts)} broken." in out, out[-3000:]
    sections = _broken_sections(out, [c["name"] for c in contracts.values()])
    for rel, line, cid, says in INJECTIONS:
        section = sections[contracts[cid]["name"]]
        assert says in section, (rel, line, cid, section[:2000])
    assert "precnb.newmodule" in sections[contracts["layers"]["name"]]  # exhaustive: an unplaced module
    assert "precnb.analysis.newmodule" in sections[contracts["analysis-layers"]["name"]]


def _broken_sections(out: str, names: list[str]) -> dict[str, str]:
    """The report of each broken contract (the text after its name, up to the next contract's)."""
    broken = out[out.index("Broken contracts"):]
    starts = sorted((broken.index(n), n) for n in names if n in broken)
    ends = [s for s, _ in starts[1:]] + [len(broken)]
    return {n: broken[s:e] for (s, n), e in zip(starts, ends, strict=True)}


def test_the_explorer_reaches_the_report_by_name_only():
    """widgets/export.py gets write_html from precnb._exporters (no import edge widgets -> report)."""
    pytest.importorskip("jinja2", reason="the report needs the [notebook] extra")
    from precnb._exporters import EXPORTERS, exporter
    from precnb.report import write_html

    assert exporter("html") is write_html
    assert set(EXPORTERS) == {"html"}
    source = (ROOT / "precnb" / "widgets" / "export.py").read_text(encoding="utf-8")
    assert "precnb.report import" not in source and 'exporter("html")' in source


def _cycles(package: str, root: Path) -> list[tuple[str, str]]:
    """Pairs of modules of *package* (under *root*) that import each other, directly or through others."""
    code = ("import grimp, json, sys\n"
            f"g = grimp.build_graph({package!r})\n"
            "out = set()\n"
            "for m in g.modules:\n"
            "    for imp in g.find_modules_directly_imported_by(m):\n"
            "        if imp != m and g.find_shortest_chain(importer=imp, imported=m):\n"
            "            out.add(tuple(sorted((m, imp))))\n"
            "print(json.dumps(sorted(out)))\n")
    import json

    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [tuple(x) for x in json.loads(proc.stdout)]


def test_no_import_cycles():
    """No module imports one that (directly or not) imports it back, lazy imports included."""
    assert _cycles("precnb", ROOT) == []


def test_an_import_cycle_is_found(tmp_path):
    shutil.copytree(ROOT / "precnb", tmp_path / "precnb", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "precnb" / "analysis" / "divergence" / "stepwise.py", "a", encoding="utf-8") as fh:
        fh.write("\n\ndef _back():\n    from precnb.analysis.divergence import first_divergence  # noqa: F401\n")
    assert ("precnb.analysis.divergence", "precnb.analysis.divergence.stepwise") in _cycles("precnb", tmp_path)


def _top_level_imports(tree: ast.Module, module: str) -> list[tuple[str, list[str]]]:
    """``(base, [base.name, ...])`` of each import run when *module* is imported (not in functions, classes or
    ``if TYPE_CHECKING``)."""
    out: list[tuple[str, list[str]]] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, [f"{node.module}.{a.name}" for a in node.names]))
        elif (isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test)) or isinstance(
                node, (ast.Try, ast.With)):
            stack.extend(s for part in ("body", "orelse", "finalbody", "handlers") for s in getattr(node, part, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return out


def _init_import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the modules importing it runs first, counting the ``__init__`` of every package on the way.

    ``import a.b.c`` runs ``a.b``'s ``__init__`` (its re-exports) before ``a.b.c``; grimp's graph, and so
    :func:`_cycles`, has the edge to ``a.b.c`` only. A package's own ancestors are running already (not an edge),
    nor is ``from a.b import c`` of a submodule ``c``, which works while ``a.b`` is half imported.
    """
    files = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (root / "precnb").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps = graph.setdefault(mod, set())
        for base, names in _top_level_imports(ast.parse(path.read_text(encoding="utf-8")), mod):
            if not names or not all(n in files for n in names):
                deps.add(base)  # a name taken from base itself: base must have run to its end
            for target in [base, *names]:
                parts = target.split(".")
                deps.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                            if p in files and p != mod and not mod.startswith(p + "."))
        deps &= files.keys()
        deps.discard(mod)
    return graph


def _init_cycle(root: Path) -> list[str]:
    try:
        graphlib.TopologicalSorter(_init_import_graph(root)).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


def test_no_cycle_through_a_package_init():
    """Importing a module never waits for one that is half imported, package ``__init__`` re-exports included.

    Such a cycle works or fails with an ImportError depending on which module is imported first.
    """
    assert _init_cycle(ROOT) == []


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    shutil.copytree(ROOT / "precnb", tmp_path / "precnb", ignore=shutil.ignore_patterns("__pycache__"))
    # replicas/__init__ imports causal.dataflow at the top: importing dataflow first would run it half-done
    path = tmp_path / "precnb" / "analysis" / "causal" / "dataflow.py"
    path.write_text(path.read_text(encoding="utf-8") + "\nfrom precnb.analysis.replicas.rank_args import glue_labels"
                    "  # noqa\n", encoding="utf-8")
    assert _cycles("precnb", tmp_path) == []  # grimp sees no cycle: dataflow -> replicas.rank_args only
    cycle = _init_cycle(tmp_path)
    assert {"precnb.analysis.causal.dataflow", "precnb.analysis.replicas"} <= set(cycle), cycle

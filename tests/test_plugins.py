"""Third-party plug-ins: one tiny package declares a reader, a diagnosis, a panel and an exporter.

The package is written the way docs/ARCHITECTURE.md ("Adding a reader / a diagnosis / a panel")
tells a contributor to: a module per plug-in and a ``pyproject.toml`` declaring the entry points.
It is made visible as an installed distribution (a ``.dist-info`` built from that pyproject, on
``sys.path`` of a fresh interpreter), which is what ``pip install`` leaves behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

PYPROJECT = """\
[project]
name = "precnb-toyplug"
version = "1.0"

[project.entry-points."precnb.readers"]
toy = "toyplug.reader:READER"
broken_reader = "toyplug.no_such_module:READER"

[project.entry-points."precnb.diagnoses"]
toy_check = "toyplug.diagnosis:DIAGNOSIS"
broken_diagnosis = "toyplug.reader:READER"

[project.entry-points."precnb.panels"]
toy_tab = "toyplug.panel:ToyPanel"
broken_panel = "toyplug.panel:NOT_THERE"

[project.entry-points."precnb.exporters"]
toy_json = "toyplug.export:write_json"
broken_exporter = "toyplug.export:NUMBER"
"""

MODULES = {
    "__init__.py": "",
    "reader.py": '''
        from pathlib import Path

        from precnb.io._assemble import RecordBuilder, assemble
        from precnb.io.readers import Reader


        def can_open(path):
            return Path(path).suffix == ".toy"


        def open_toy(path, **_):
            b = RecordBuilder(step=0, rank=0)
            for i, word in enumerate(Path(path).read_text().split()):
                v = float(word)
                b.add(f"t{i}.output.0", {"max": v, "min": v, "mean": v, "norm": 0.0},
                      node=f"t{i}", kind="api", role="output")
            return assemble([b.build()], source_format="toy")


        READER = Reader(name="toy", can_open=can_open, open=open_toy, description="toy file")
    ''',
    "diagnosis.py": '''
        import numpy as np

        from precnb.analysis.findings import Finding
        from precnb.analysis.registry import Diagnosis


        def run(ctx):
            mx = ctx.target["max"].max("tensor").transpose("step", "rank")
            bad = np.argwhere(mx.values > 100.0)
            if not len(bad):
                return []
            s, r = bad[0]
            return [Finding(kind="toy_check", reason="max above 100",
                            step=int(mx["step"].values[s]), rank=int(mx["rank"].values[r]))]


        DIAGNOSIS = Diagnosis(kind="toy_check", title="Toy check", priority=90, mode="any", run=run,
                              description="a value above 100")
    ''',
    "panel.py": '''
        import ipywidgets as ipw

        from precnb.widgets.panel import Panel


        class ToyPanel(Panel):
            title = "Toy"

            def refresh(self):
                self.children = [ipw.HTML(f"{len(self.api.findings())} finding(s)")]
    ''',
    "export.py": '''
        import json
        from pathlib import Path

        NUMBER = 3


        def write_json(source, path, **_):
            Path(path).write_text(json.dumps({"vars": sorted(source.data_vars)}))
            return Path(path)
    ''',
}

CHECK = """
import json, sys, warnings
from pathlib import Path
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import precnb
    light = "toyplug" not in " ".join(sys.modules)
    from precnb._exporters import exporter, exporter_names
    from precnb.analysis import registry
    from precnb.io.readers import reader_names
    from precnb.widgets.tabs import default_panels
    names = {"readers": list(reader_names()), "exporters": list(exporter_names())}
    listed_only = "toyplug" not in " ".join(sys.modules)
    toy = Path(sys.argv[1])
    out = {"light": light, "listed_only": listed_only, **names,
           "format": precnb.detect_format(toy),
           "max": [float(v) for v in precnb.open_run(toy)["max"].sel(step=0, rank=0).values],
           "kinds": registry.kinds()}
    ds = precnb.open_run(toy)
    f = registry.get("toy_check").run(registry.Context(target=ds))
    out["finding"] = [f[0].kind, f[0].step, f[0].rank] if f else None
    out["panels"] = [getattr(getattr(p, "__self__", p), "__name__", "?") for p in default_panels()]
    out["exported"] = json.loads(Path(exporter("toy_json")(ds, Path(sys.argv[2]))).read_text())
    try:
        exporter("broken_exporter")
        out["broken_exporter"] = "loaded"
    except KeyError as err:
        out["broken_exporter"] = str(err)
    out["msprobe_ok"] = precnb.detect_format(Path(sys.argv[3])) == "msprobe"
out["warnings"] = sorted({str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)})
print(json.dumps(out))
"""


def make_plugin_package(root: Path) -> Path:
    """Write the toy package (sources + pyproject) under *root*/src; return the project folder."""
    project = root / "precnb-toyplug"
    pkg = project / "toyplug"
    pkg.mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT)
    for name, code in MODULES.items():
        (pkg / name).write_text(textwrap.dedent(code).lstrip())
    return project


def install_as_dist_info(project: Path, site: Path) -> None:
    """What ``pip install --no-deps`` leaves: the package and a .dist-info with its entry points."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    site.mkdir(parents=True, exist_ok=True)
    (site / "toyplug").symlink_to(project / "toyplug", target_is_directory=True)
    dist = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    groups = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
              for group, eps in meta["entry-points"].items()]
    (dist / "entry_points.txt").write_text("\n".join(groups))


@pytest.fixture(scope="module")
def plugged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plug")
    install_as_dist_info(make_plugin_package(tmp), tmp / "site")
    toy = tmp / "run.toy"
    toy.write_text("1.5 -inf nan 250")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp / "site")])}
    env.pop("PRECNB_NO_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-c", CHECK, str(toy), str(tmp / "out.json"),
                           str(ROOT / "data_samples" / "dp_nan")],
                          capture_output=True, text=True, env=env, cwd=tmp, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_precnb_loads_no_plugin(plugged):
    assert plugged["light"] and plugged["listed_only"]  # names are listed from metadata, nothing imported


def test_reader_plugin_is_picked_up(plugged):
    assert plugged["readers"][:7] == ["msprobe", "monitor", "kernel", "kernel_tensors", "compare", "config_check",
                                      "zarr"]
    assert plugged["readers"][7:] == ["broken_reader", "toy"]  # listed from metadata before any is loaded
    assert plugged["format"] == "toy"
    got = plugged["max"]
    assert got[0] == 1.5 and got[1] == float("-inf") and got[2] != got[2] and got[3] == 250.0
    assert plugged["msprobe_ok"]


def test_diagnosis_plugin_is_picked_up(plugged):
    assert "toy_check" in plugged["kinds"] and "broken_diagnosis" not in plugged["kinds"]
    assert plugged["kinds"].index("toy_check") < plugged["kinds"].index("none")
    assert plugged["finding"] == ["toy_check", 0, 0]  # step 0, rank 0 holds the 250


def test_panel_plugin_is_picked_up(plugged):
    assert plugged["panels"] == ["FindingPanel", "TriagePanel", "AlignmentPanel", "ShardPanel", "HierarchyPanel",
                                 "ExportPanel", "ToyPanel"]


def test_exporter_plugin_is_picked_up(plugged):
    assert "toy_json" in plugged["exporters"] and plugged["exporters"][0] == "html"
    assert plugged["exported"] == {"vars": sorted(plugged["exported"]["vars"])} and "max" in plugged["exported"]["vars"]


def test_broken_plugins_warn_by_name_and_never_crash(plugged):
    assert "no exporter 'broken_exporter'; known: html, toy_json" in plugged["broken_exporter"]
    text = "\n".join(plugged["warnings"])
    for kind, name in [("reader", "broken_reader"), ("diagnosis", "broken_diagnosis"), ("panel", "broken_panel"),
                       ("exporter", "broken_exporter")]:
        assert re.search(rf"precnb {kind} plug-in '{name}' \(toyplug\.[\w.:]+\) could not be loaded", text), kind

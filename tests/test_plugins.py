"""Third-party plug-ins: one tiny package declares a reader, a diagnosis, a panel and an exporter.

The package is the one docs/ARCHITECTURE.md ("How to add …") shows, block by block, so the documented
steps stay true: a module per plug-in and a ``pyproject.toml`` declaring the entry points.
It is made visible as an installed distribution (a ``.dist-info`` built from that pyproject, on
``sys.path`` of a fresh interpreter), which is what ``pip install`` leaves behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

#: entries a careless plug-in author could write: each must warn by name and break nothing
BROKEN = {
    "precnb.readers": {"broken_reader": "toyplug.no_such_module:READER"},
    "precnb.diagnoses": {"broken_diagnosis": "toyplug.reader:READER"},  # a Reader is not a Diagnosis
    "precnb.panels": {"broken_panel": "toyplug.panel:NOT_THERE"},
    "precnb.exporters": {"broken_exporter": "toyplug.export:json"},  # a module, not a callable
}


def documented_files() -> dict[str, str]:
    """The code blocks of docs/ARCHITECTURE.md whose first line names a file (``# toyplug/reader.py``)."""
    files = {}
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", ARCHITECTURE.read_text(), flags=re.S):
        first, _, body = block.partition("\n")
        if first.startswith("# ") and first[2:].strip().endswith((".py", ".toml")):
            files[first[2:].strip()] = body
    return files


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
    """Write the documented toy package (its modules and pyproject) under *root*; return the project folder."""
    project = root / "precnb-toyplug"
    (project / "toyplug").mkdir(parents=True)
    (project / "toyplug" / "__init__.py").write_text("")
    for name, text in documented_files().items():
        (project / name).write_text(text)
    return project


def install_as_dist_info(project: Path, site: Path, extra: dict[str, dict[str, str]]) -> None:
    """What ``pip install --no-deps`` leaves: the package and a .dist-info with its entry points (+ *extra*)."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    site.mkdir(parents=True, exist_ok=True)
    (site / "toyplug").symlink_to(project / "toyplug", target_is_directory=True)
    dist = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    groups = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in {**eps, **extra.get(group, {})}.items())
              for group, eps in meta["entry-points"].items()]
    (dist / "entry_points.txt").write_text("\n".join(groups))


def test_the_documented_package_has_one_plugin_per_group():
    files = documented_files()
    assert set(files) == {"pyproject.toml", "toyplug/reader.py", "toyplug/diagnosis.py", "toyplug/panel.py",
                          "toyplug/export.py"}
    groups = tomllib.loads(files["pyproject.toml"])["project"]["entry-points"]
    assert set(groups) == {"precnb.readers", "precnb.diagnoses", "precnb.panels", "precnb.exporters"}


@pytest.fixture(scope="module")
def plugged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plug")
    install_as_dist_info(make_plugin_package(tmp), tmp / "site", BROKEN)
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
                                 "ExpertsPanel", "ExportPanel", "ToyPanel"]


def test_exporter_plugin_is_picked_up(plugged):
    assert "toy_json" in plugged["exporters"] and plugged["exporters"][0] == "html"
    assert plugged["exported"] == {"vars": sorted(plugged["exported"]["vars"])} and "max" in plugged["exported"]["vars"]


def test_broken_plugins_warn_by_name_and_never_crash(plugged):
    assert "no exporter 'broken_exporter'; known: html, toy_json" in plugged["broken_exporter"]
    text = "\n".join(plugged["warnings"])
    for kind, name in [("reader", "broken_reader"), ("diagnosis", "broken_diagnosis"), ("panel", "broken_panel"),
                       ("exporter", "broken_exporter")]:
        assert re.search(rf"precnb {kind} plug-in '{name}' \(toyplug\.[\w.:]+\) could not be loaded", text), kind

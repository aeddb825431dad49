"""Notebook templates: committed clean, parameterised, shipped in the package, and runnable.

* every ``notebooks/*.ipynb`` (the templates' one committed copy, read from a checkout; the build
  puts them into the wheel) has no outputs, a ``parameters`` cell and guidance text, and is
  stripped (``tools/strip_notebooks.py --check``);
* ``precnb template`` lists, fills (papermill ``injected-parameters``) and refuses bad input,
  also from an installed wheel (not the checkout);
* each template runs top to bottom on the bundled samples with papermill (``slow``) and, when
  ``make offline-template`` has built the nbconvert template, exports to offline HTML whose
  static gate passes (the browser check is ``tests/browser/test_report_offline.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("papermill")

from precnb.report import notebooks  # noqa: E402

NAMES = ["nan_origin", "divergence", "sharded_vs_single", "dp_grad_sync", "monitor_trends"]
SOURCE = ROOT / "notebooks"

# what each template must say about its bundled sample (ground truth in data_samples/*/ground_truth.json)
EXPECTED = {
    "nan_origin": ["first NaN at step 1, rank 1: Torch.sqrt.0.forward", "inherited via communication",
                   "scores = scores + torch.sqrt(poison)"],
    "divergence": ["FIRST DIVERGENCE: Functional.gelu.0.forward at step 1, rank 0"],
    "sharded_vs_single": ["all replicas agree", "no value divergence beyond tolerance", "partial_sum"],
    "dp_grad_sync": ["all replicas agree", "median ratio 2; data-parallel world size 2",
                     "gradients summed, not averaged", "Tensor.div_.0.forward"],
    "monitor_trends": ["actv_grad/lm_head.input norm spikes", "actv/blocks.1.attn.output"],
}


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _params_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, "exactly one cell tagged 'parameters'"
    return cells[0]


# -- committed notebooks ---------------------------------------------------------------------------


def test_the_five_templates_exist_once_and_are_what_precnb_template_reads():
    assert sorted(p.stem for p in SOURCE.glob("*.ipynb")) == sorted(NAMES)
    assert notebooks.list_templates() == NAMES
    tracked = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0:  # a git checkout: no second committed copy (the build makes the package's)
        copies = sorted(f for f in tracked.stdout.split() if Path(f).stem in NAMES)
        assert copies == sorted(f"notebooks/{n}.ipynb" for n in NAMES)
    assert not (ROOT / "precnb" / "templates" / "notebooks").exists()
    for name in NAMES:  # from a checkout (an editable install too) the templates are notebooks/ itself
        assert notebooks.read_template(name) == nbformat.read(SOURCE / f"{name}.ipynb", as_version=4)


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_clean_and_parameterised(name):
    nb = _read(SOURCE / f"{name}.ipynb")
    nbformat.validate(nb)
    assert set(nb.metadata) <= {"kernelspec", "language_info"}, "no widget state / papermill metadata"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert "Use it when" in first.source and "incident" in first.source.lower()  # guidance up front
    params = _params_cell(nb)
    assert nb.cells.index(params) == 1
    assert "report = \"\"" in params.source
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "precnb.sample_path(" in code  # defaults resolve the bundled samples from anywhere
    assert "viz.enable_static()" in code  # static charts survive export without a CDN (drawn in a child process)
    assert "precnb.explore(" in code
    assert "precnb.report.write_html(" in code
    described = notebooks.describe(name)["parameters"]
    assert described and all(spec["help"] for spec in described.values()), "every parameter is commented"


def test_committed_templates_are_stripped():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "strip_notebooks.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- precnb template -------------------------------------------------------------------------------


def test_template_list(capsys):
    from precnb.cli import main

    assert main(["template", "--list"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert name in out
    assert "-p step_offset" in out and "NaN / Inf origin triage across ranks" in out


def test_template_fill(tmp_path, capsys):
    from precnb.cli import main

    out = tmp_path / "incident" / "my.ipynb"
    assert main(["template", "divergence", "-o", str(out)]) == 1  # precnb creates no folder
    assert "incident does not exist (precnb does not create folders" in capsys.readouterr().err
    out.parent.mkdir()
    code = main(["template", "divergence", "-o", str(out), "-p", "baseline", "/data/gpu run",
                 "-p", "target", "/data/npu", "-p", "step_offset", "auto", "-p", "tolerance", "0.001"])
    assert code == 0, capsys.readouterr().err
    nb = _read(out)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1
    assert nb.cells.index(injected[0]) == nb.cells.index(_params_cell(nb)) + 1
    ns: dict = {}
    exec(injected[0].source, ns)
    assert ns["baseline"] == "/data/gpu run" and ns["target"] == "/data/npu"
    assert ns["step_offset"] == "auto" and ns["tolerance"] == 0.001
    assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code")
    # list / JSON values and numbers
    out2 = tmp_path / "nan.ipynb"
    assert main(["template", "nan_origin", "-o", str(out2), "-p", "steps", "[0, 1]", "-p", "ranks", "none"]) == 0
    ns = {}
    exec(next(c for c in _read(out2).cells if "injected-parameters" in c.metadata.get("tags", [])).source, ns)
    assert ns["steps"] == [0, 1] and ns["ranks"] is None
    # no parameters: a plain copy
    out3 = tmp_path / "plain.ipynb"
    assert main(["template", "monitor_trends", "-o", str(out3)]) == 0
    copy, orig = _read(out3), _read(SOURCE / "monitor_trends.ipynb")
    assert copy.cells == orig.cells
    assert copy.metadata.pop("precnb_output")["kind"] == "notebook:monitor_trends"  # --overwrite may replace it
    assert copy.metadata == orig.metadata


def test_template_errors(tmp_path, capsys):
    from precnb.cli import main

    assert main(["template", "nope", "-o", str(tmp_path / "x.ipynb")]) == 2
    assert "known: nan_origin" in capsys.readouterr().err
    assert main(["template", "nan_origin", "-o", str(tmp_path / "x.ipynb"), "-p", "bogus", "1"]) == 2
    assert "takes: run, steps, ranks, report" in capsys.readouterr().err
    assert main(["template", "nan_origin"]) == 2
    assert main(["template"]) == 2
    target = tmp_path / "exists.ipynb"
    target.write_text("{}")
    assert main(["template", "nan_origin", "-o", str(target)]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["template", "nan_origin", "-o", str(target), "--overwrite"]) == 1  # not precnb's: kept
    assert "is not a precnb output" in capsys.readouterr().err and target.read_text() == "{}"
    ours = tmp_path / "ours.ipynb"
    assert main(["template", "nan_origin", "-o", str(ours)]) == 0
    assert main(["template", "divergence", "-o", str(ours)]) == 1
    assert main(["template", "divergence", "-o", str(ours), "--overwrite"]) == 0
    assert _read(ours).metadata["precnb_output"]["kind"] == "notebook:divergence"


@pytest.mark.slow
def test_template_command_works_from_an_installed_wheel(tmp_path, built_wheel):
    """Install the wheel into a folder, run `precnb template` from it and execute a template with its defaults."""
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    inst = subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(built_wheel)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = ("import json, precnb, precnb.report.notebooks as n; from precnb.cli import main; "
            "rc = main(['template', 'sharded_vs_single', '-o', 'out.ipynb', '-p', 'target_layout', 'tp=4']); "
            "rc2 = main(['template', 'nan_origin', '-o', 'nan.ipynb', '--execute']); "
            "print(json.dumps([precnb.__file__, rc, rc2, n.list_templates(), str(precnb.sample_path())]))")
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("PRECNB_SAMPLES", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    file, rc, rc2, names, samples = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(file).resolve().is_relative_to(site.resolve()), file  # the installed copy, not the checkout
    assert Path(samples).resolve() == (site / "precnb" / "data_samples").resolve()  # shipped in the wheel
    assert rc == 0 and rc2 == 0 and names == NAMES
    nb = _read(work / "out.ipynb")
    assert any("target_layout = \"tp=4\"" in c.source for c in nb.cells)
    assert (site / "precnb" / "templates" / "report" / "report.html.j2").is_file()
    # the template's default parameters read the bundled sample from the installed package
    ran = _read(work / "nan.ipynb")
    text = "\n".join(o.get("text", "") for c in ran.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream")
    assert f"{site / 'precnb' / 'data_samples' / 'dp_nan'}: 3 steps × 2 ranks" in text, text[:2000]
    assert "Torch.sqrt.0.forward" in text


# -- execution -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_template_runs_on_the_bundled_samples(name, tmp_path, executed_templates):
    nb_path, folder, error = executed_templates[name]  # executed once per session (conftest)
    if error is not None:
        raise error
    nb = _read(nb_path)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream")
    for expected in EXPECTED[name]:
        shown = text + json.dumps([o.get("data", {}).get("text/html", "") for c in nb.cells
                                   if c.cell_type == "code" for o in c.outputs])
        assert expected in shown, expected
    mimes = [m for c in nb.cells if c.cell_type == "code" for o in c.outputs for m in o.get("data", {})]
    assert "application/vnd.jupyter.widget-view+json" in mimes  # the explorer
    assert "image/svg+xml" in mimes  # static charts
    assert not any(m.startswith("application/vnd.vegalite") for m in mimes)  # no CDN-dependent renderer
    assert nb.metadata.get("widgets")  # widget state saved for the export
    report = folder / "report.html"
    assert report.is_file() and report.stat().st_size < 10_000_000
    assert "precnb report" in report.read_text(encoding="utf-8")[:2000]
    tdir = notebooks.offline_template_dir()
    if tdir is None:
        return  # the browser test skips with the reason; execution is what this test checks
    html_path = notebooks.export_html(nb, tmp_path / f"{name}.html", template_dir=tdir)
    html = html_path.read_text(encoding="utf-8")
    from tests.test_report import external_urls

    bs4 = pytest.importorskip("bs4")
    soup = bs4.BeautifulSoup(html, "html.parser")
    assert external_urls(soup) == [], "the exported notebook must not reference external resources"
    assert not [s for s in soup.find_all("script") if s.get("src")]
    # (a raw grep for CDN hosts would hit html-manager's fallback strings: the browser test is the real gate)

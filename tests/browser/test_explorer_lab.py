"""The explorer in real JupyterLab, driven by headless Debian chromium (playwright, no download).

Starts JupyterLab on 127.0.0.1 (random port and token, throw-away config dirs, ``--allow-root``,
news toast off), opens a generated notebook with two explorers — a run with a NaN (opens at the
NaN origin) and a baseline/target pair (opened without a search) — then:

* clicks a heat-map cell and checks that the line chart and the detail table changed, that the
  selection label changed, and that the kernel's ``ex.step / ex.rank / ex.tensor`` did too;
* clicks "Find first divergence" and checks that the expected node is shown;
* opens the Hierarchy tab and checks that the module tree is drawn;
* saves screenshots in the test's tmp folder and copies them to ``test-output/``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, sample_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

NB = "window.jupyterapp?.shell?.currentWidget"  # optional: JupyterLab may not be up yet when first polled


def _cells(nan_run: Path, base: Path, target: Path) -> list[str]:
    return [
        "import precnb\n"
        f"ex = precnb.explore(precnb.open_run({str(nan_run)!r}))\n"
        "ex",
        f"pair = precnb.explore({{'baseline': precnb.open_run({str(base)!r}),\n"
        f"                        'target': precnb.open_run({str(target)!r})}}, auto=False)\n"
        "pair",
    ]


@pytest.fixture(scope="module")
def samples():
    return sample_path("dp_nan"), sample_path("divergence", "baseline"), sample_path("divergence", "target")


@pytest.fixture(scope="module")
def lab(tmp_path_factory, samples):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("jupyterlab")
    root, home = tmp_path_factory.mktemp("nb"), tmp_path_factory.mktemp("jhome")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in _cells(*samples)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "explorer.ipynb")
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "Jupyter news?" toast over the widgets
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "cfg"), JUPYTER_RUNTIME_DIR=str(home / "rt"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "ws"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PRECNB_NO_DASK_CLIENT="1")
    log = open(home / "server.log", "w")  # noqa: SIM115 - closed below
    srv = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            assert srv.poll() is None, (home / "server.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=1)
                break
            except OSError:
                assert time.time() < deadline, "jupyter lab did not start"
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/lab/tree/explorer.ipynb?token={token}"
    finally:
        srv.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            srv.wait(15)
        except subprocess.TimeoutExpired:
            srv.kill()
        log.close()


def _kernel(page, code: str) -> str:
    """Run *code* in the notebook's kernel and return its stdout (Python-side state read-back)."""
    return page.evaluate(
        """async (code) => {
            const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            const fut = k.requestExecute({code, silent: false, store_history: false});
            let out = "";
            fut.onIOPub = (msg) => { if (msg.header.msg_type === "stream") out += msg.content.text; };
            await fut.done;
            return out;
        }""", code)


def _wait_idle(page) -> None:
    page.wait_for_function(f"{NB}.sessionContext.session.kernel.status === 'idle'", timeout=30_000)


def test_explorer_in_jupyterlab(chromium, lab, samples, tmp_path):
    from playwright.sync_api import expect

    import precnb

    expect.set_options(timeout=20_000)  # a loaded CI machine renders slowly; 5 s is too tight

    nan_run, base, target = samples
    origin = precnb.nan_origin(precnb.open_run(nan_run))
    divergence = precnb.first_divergence(precnb.open_run(base), precnb.open_run(target))
    t0 = time.time()
    page = chromium.new_page(viewport={"width": 1400, "height": 2000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(lab)
    page.wait_for_function(f"{NB}?.sessionContext?.session?.kernel?.status === 'idle'", timeout=60_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(f"""() => {NB}.content.widgets.every(c => c.model.executionCount)
                                  && {NB}.sessionContext.session.kernel.status === 'idle'""",
                           timeout=120_000)
    explorer = page.locator(".precnb-explorer").first
    cells = explorer.locator(".precnb-heatmap g.mark-rect path")
    expect(cells.first).to_be_visible(timeout=30_000)
    status = explorer.locator(".precnb-selection")
    # it opened at the NaN origin
    expect(status).to_contain_text(f"step {origin.step} · rank {origin.rank}")
    expect(status).to_contain_text(origin.tensor)
    lines_svg = explorer.locator(".precnb-lines .vega-embed svg").first
    expect(lines_svg.locator("g.mark-line path").first).to_be_attached()
    detail = explorer.locator(".precnb-detail")
    before = (status.inner_text(), lines_svg.inner_html(), detail.inner_text())

    # click a heat-map cell at step 0 in another module (cells carry their fields as aria-label)
    labels = cells.evaluate_all("els => els.map(e => e.getAttribute('aria-label') || '')")
    origin_row = _kernel(page, "print(ex.row)").strip()
    pick = next(i for i, s in enumerate(labels)
                if "step: 0" in s and f"row: {origin_row};" not in s and "row: " in s)
    row = labels[pick].split("row: ")[1].split(";")[0]
    cells.nth(pick).click()
    expect(status).to_contain_text("step 0 · rank", timeout=15_000)
    _wait_idle(page)
    after = (status.inner_text(), lines_svg.inner_html(), detail.inner_text())
    assert after[0] != before[0]
    assert after[1] != before[1], "the line chart did not change"
    assert after[2] != before[2] and row in after[2], "the detail table did not change"
    state = json.loads(_kernel(page, "import json; print(json.dumps([ex.row, ex.step, ex.rank, ex.tensor]))"))
    assert state[0] == row and state[1] == 0 and state[3] in after[0]
    assert state[:3] != [origin_row, origin.step, origin.rank]
    shot = tmp_path / "explorer.png"
    explorer.screenshot(path=str(shot))

    # the module hierarchy (construct.json) is drawn when its tab is opened
    explorer.get_by_role("tab", name="Hierarchy").click()
    expect(explorer.locator(".precnb-hierarchy g.mark-rect path").first).to_be_attached(timeout=20_000)
    _wait_idle(page)
    hier_shot = tmp_path / "explorer_hierarchy.png"
    explorer.locator(".precnb-hierarchy").screenshot(path=str(hier_shot))

    # the pair: "Find first divergence" goes through the kernel and shows the node
    pair = page.locator(".precnb-explorer").nth(1)
    pair.get_by_role("button", name="Find first divergence").click()
    expect(pair.locator(".precnb-divergence-output")).to_contain_text(divergence.node, timeout=20_000)
    expect(pair.locator(".precnb-selection")).to_contain_text(divergence.tensor)
    _wait_idle(page)
    assert _kernel(page, "print(pair.tensor)").strip() == divergence.tensor
    pair_shot = tmp_path / "explorer_divergence.png"
    pair.screenshot(path=str(pair_shot))
    assert not [e for e in errors if "precnb" in e or "vega" in e.lower()], errors
    out = ROOT / "test-output"
    out.mkdir(exist_ok=True)
    shutil.copy(shot, out / "explorer.png")
    shutil.copy(pair_shot, out / "explorer_divergence.png")
    shutil.copy(hier_shot, out / "explorer_hierarchy.png")
    page.close()
    assert time.time() - t0 < 90

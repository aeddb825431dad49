"""Shared by the browser tests: headless Debian chromium through playwright-python.

Never ``playwright install`` (no download): the system chromium (``apt-get install chromium``,
``make system-deps``) is launched by path; ``CHROMIUM`` overrides it. The tests skip, saying
why, when it or playwright is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture(scope="module")
def chromium():
    """One headless browser per test module."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium; `make system-deps`)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


NB = "window.jupyterapp?.shell?.currentWidget"  # optional: JupyterLab may not be up yet when first polled
# every cell in the page (no windowing): the n-th explorer is the n-th cell's, wherever the page scrolls
NO_WINDOWING = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}


def explore_cells(head: str, incidents: list[tuple]) -> list[str]:
    """*head*, then a cell ``exN = precnb.explore(TARGET, baseline=BASE, **OPTIONS)`` per incident.

    An incident is ``(name, target sample, baseline sample or None[, options])``.
    """
    from tests.conftest import sample_path

    cells = [head]
    for i, (_name, target, base, *rest) in enumerate(incidents):
        args = [repr(str(sample_path(target)))]
        if base:
            args.append("baseline=" + repr(str(sample_path(base))))
        args += [f"{k}={v!r}" for k, v in (rest[0] if rest else {}).items()]
        cells.append(f"ex{i} = precnb.explore({', '.join(args)})\nex{i}")
    return cells


@contextlib.contextmanager
def jupyter_lab(tmp_path_factory, cells: list[str], name: str, settings: dict[str, dict] | None = None):
    """A JupyterLab server on 127.0.0.1 (random port and token, throw-away config dirs) serving a notebook.

    The notebook *name* holds *cells* (code); *settings*: extension settings (``"plugin id": {...}``, e.g.
    ``"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True}``). Yields ``{"url", "root"}``.
    The server is stopped (SIGTERM, then kill on timeout) when the block ends.
    """
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("jupyterlab")
    root, home = tmp_path_factory.mktemp("nb"), tmp_path_factory.mktemp("jhome")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / name)
    settings_dir = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings_dir.mkdir(parents=True)  # no "Jupyter news?" toast over the widgets
    (settings_dir / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    for plugin, values in (settings or {}).items():
        package, _, file = plugin.rpartition(":")
        where = home / "settings" / package
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{file}.jupyterlab-settings").write_text(json.dumps(values))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    root_dir = Path(__file__).resolve().parents[2]
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "cfg"), JUPYTER_RUNTIME_DIR=str(home / "rt"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "ws"),
               PYTHONPATH=os.pathsep.join([str(root_dir), os.environ.get("PYTHONPATH", "")]),
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
        yield {"url": f"http://127.0.0.1:{port}/lab/tree/{name}?token={token}", "root": root, "token": token,
               "port": port}
    finally:
        srv.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            srv.wait(15)
        except subprocess.TimeoutExpired:
            srv.kill()
        log.close()


def open_notebook(chromium, url: str, *, viewport: dict, run: bool = True):
    """A page on the notebook at *url*, its cells run (``run``); page errors are collected in ``page.errors``."""
    page = chromium.new_page(viewport=viewport)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel?.status"
                           " === 'idle'", timeout=90_000)
    if run:
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(f"""() => {NB}?.content?.widgets?.every(c => c.model.executionCount)
                                      && {NB}?.sessionContext?.session?.kernel?.status === 'idle'""",
                               timeout=600_000)
    return page


def kernel_output(page, code: str) -> str:
    """Run *code* in the notebook's kernel and return its stdout (Python-side state read-back)."""
    return page.evaluate(
        """async (code) => {
            const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            const fut = k.requestExecute({code, silent: false, store_history: false});
            let out = "";
            fut.onIOPub = (msg) => {
                if (msg.header.msg_type === "stream") out += msg.content.text;
                if (msg.header.msg_type === "error") out += `KERNEL ERROR ${msg.content.ename}: ${msg.content.evalue}`;
            };
            await fut.done;
            return out;
        }""", code)


def wait_idle(page) -> None:
    """Wait until the notebook's kernel is idle."""
    page.wait_for_function(f"{NB}?.sessionContext?.session?.kernel?.status === 'idle'", timeout=60_000)

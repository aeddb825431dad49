"""Notebook templates: list them, copy one out with parameters filled, run it, export it offline.

The templates are the repository's ``notebooks/*.ipynb``, their one committed copy: read
there from a source checkout (an editable install too), and from the package data a wheel
carries (``precnb/templates/notebooks/``, copied in by the build, ``setup.py``). Each has a
cell tagged ``parameters`` (papermill); filling a template inserts papermill's
``injected-parameters`` cell after it.

HTML export uses the ``offline_lab`` nbconvert template built by
``tools/build_offline_template.sh`` (``make offline-template``): the exported page inlines
require.js, vega-embed, anywidget and the ipywidgets HTML manager and loads no URL.

Examples
--------
>>> from precnb.report import notebooks
>>> "nan_origin" in notebooks.list_templates()
True
>>> notebooks.describe("nan_origin")["parameters"]["run"]["default"]
'""'
"""

from __future__ import annotations

import ast
import copy
import os
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "describe",
    "execute",
    "export_html",
    "fill_template",
    "list_templates",
    "offline_template_dir",
    "parameter_paths",
    "read_template",
]

ORDER = ("nan_origin", "divergence", "sharded_vs_single", "dp_grad_sync", "monitor_trends")
TEMPLATE_ENV = ("PRECNB_NBTEMPLATES", "OFFLINE_TEMPLATE_DIR")


_CHECKOUT = Path(__file__).resolve().parents[2]


def _folder() -> Any:
    """``notebooks/`` of the source checkout precnb is imported from, else the installed package's copy."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "notebooks").is_dir():
        return _CHECKOUT / "notebooks"
    return resources.files("precnb").joinpath("templates", "notebooks")


def list_templates() -> list[str]:
    """Names of the notebook templates (``nan_origin``, ``divergence``, ...)."""
    names = sorted(p.name[: -len(".ipynb")] for p in _folder().iterdir() if p.name.endswith(".ipynb"))
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def read_template(name: str) -> Any:
    """The template as an :class:`nbformat.NotebookNode` (outputs stripped).

    Raises
    ------
    KeyError
        For an unknown name (the message lists the known ones).
    """
    import nbformat

    name = name[: -len(".ipynb")] if name.endswith(".ipynb") else name
    if name not in list_templates():
        raise KeyError(f"no notebook template {name!r}; known: {', '.join(list_templates())}")
    text = _folder().joinpath(f"{name}.ipynb").read_text(encoding="utf-8")
    return nbformat.reads(text, as_version=4)


def _parameters_cell(nb: Any) -> Any:
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell
    return None


def _parameters(nb: Any) -> dict[str, dict[str, str]]:
    """``name -> {"default": source text, "help": comment}`` from the parameters cell."""
    cell = _parameters_cell(nb)
    out: dict[str, dict[str, str]] = {}
    if cell is None:
        return out
    lines = cell.source.splitlines()
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            line = lines[node.lineno - 1]
            default = ast.get_source_segment(cell.source, node.value) or ""
            comment = line.split("#", 1)[1].strip() if "#" in line[node.value.end_col_offset or 0:] else ""
            out[node.targets[0].id] = {"default": default, "help": comment}
    return out


def describe(name: str) -> dict[str, Any]:
    """Summary (the first heading) and parameters of a template."""
    nb = read_template(name)
    summary = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
            summary = first.lstrip("# ").strip()
            break
    return {"name": name, "summary": summary, "parameters": _parameters(nb)}


def fill_template(name: str, output: str | os.PathLike[str], parameters: dict[str, Any] | None = None, *,
                  overwrite: bool = False, inputs: Any = ()) -> Path:
    """Copy template *name* to *output* with *parameters* filled (papermill's injected cell).

    Written by the rules of :mod:`precnb._write`: never inside an input (*inputs*, and every
    parameter value naming an existing path, e.g. ``run``), never over a file precnb did not
    write, into an existing folder, atomically. The copy carries ``metadata["precnb_output"]``.

    Parameters
    ----------
    name : str
        See :func:`list_templates`.
    output : path-like
        The ``.ipynb`` to write.
    parameters : dict, optional
        Values for the template's parameters; unknown names raise ``ValueError``.
    overwrite : bool
        Replace an existing *output* that precnb wrote.
    inputs : iterable of path-like
        Further paths the notebook must stay out of.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    KeyError
        Unknown template.
    ValueError
        Unknown parameter names.
    precnb.errors.OutputRefusedError
        *output* exists (without *overwrite*), is not a precnb notebook, or is inside an input.
    """
    import nbformat

    from precnb._marks import MARKER_KEY, marker
    from precnb._write import check_output, writing_file

    protect = [*inputs, *parameter_paths(parameters)]
    check_output(output, inputs=protect, overwrite=overwrite, content="ipynb")
    nb = read_template(name)
    params = dict(parameters or {})
    known = _parameters(nb)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"template {name!r} has no parameter(s) {', '.join(unknown)}; "
                         f"it takes: {', '.join(known)}")
    if params:
        from papermill.parameterize import parameterize_notebook

        nb = copy.deepcopy(nb)
        for cell in nb.cells:  # papermill expects a tags list on every cell and papermill metadata
            cell.metadata.setdefault("tags", [])
        nb.metadata.setdefault("papermill", {})
        nb = parameterize_notebook(nb, params, report_mode=False)
        for cell in nb.cells:
            if not cell.metadata.get("tags"):
                cell.metadata.pop("tags", None)
        pm = nb.metadata.get("papermill", {})
        pm.pop("parameters", None)  # keep the copy free of run metadata
        if not pm:
            nb.metadata.pop("papermill", None)
    nb = copy.deepcopy(nb)
    nb.metadata[MARKER_KEY] = marker(f"notebook:{name}")
    out = Path(output).expanduser()
    with writing_file(out, inputs=protect, overwrite=overwrite) as tmp:
        nbformat.write(nb, str(tmp))
    return out


def parameter_paths(parameters: dict[str, Any] | None) -> list[str]:
    """Parameter values that name an existing file or folder (the notebook's inputs)."""
    out = []
    for v in (parameters or {}).values():
        if isinstance(v, (str, os.PathLike)) and str(v).strip():
            try:
                if os.path.lexists(os.fspath(v)):
                    out.append(os.fspath(v))
            except (OSError, ValueError):
                continue
    return out


def execute(path: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, *,
            parameters: dict[str, Any] | None = None, cwd: str | os.PathLike[str] | None = None,
            timeout: int = 600, overwrite: bool = False) -> Path:
    """Run a notebook top to bottom with papermill (widget state is kept for export).

    The executed notebook is written by the rules of :mod:`precnb._write` (atomically; in place
    only over a notebook precnb wrote, e.g. by :func:`fill_template`).

    Parameters
    ----------
    path : path-like
    output : path-like, optional
        Where to write the executed notebook (default: in place, which needs *path* to be a
        precnb notebook).
    parameters : dict, optional
    cwd : path-like, optional
        Working directory of the kernel (default: the notebook's folder).
    timeout : int
        Seconds per cell.
    overwrite : bool
        Replace an existing *output* that precnb wrote (in place: always, if precnb wrote it).

    Returns
    -------
    pathlib.Path
        The executed notebook.
    """
    import nbformat
    import papermill

    from precnb._marks import MARKER_KEY, marker
    from precnb._write import writing_file

    src = Path(path)
    out = Path(output) if output is not None else src
    in_place = output is None or os.path.abspath(out) == os.path.abspath(src)
    with writing_file(out, inputs=parameter_paths(parameters), overwrite=overwrite or in_place) as tmp:
        papermill.execute_notebook(str(src), str(tmp), parameters=parameters or {}, kernel_name="python3",
                                   cwd=str(cwd or src.resolve().parent), progress_bar=False,
                                   execution_timeout=timeout, log_output=False)
        nb = nbformat.read(str(tmp), as_version=4)
        if MARKER_KEY not in nb.metadata:
            nb.metadata[MARKER_KEY] = marker("notebook")
            nbformat.write(nb, str(tmp))
    return out


def offline_template_dir() -> Path | None:
    """Folder holding the built ``offline_lab`` nbconvert template, or None.

    Looked up in ``$PRECNB_NBTEMPLATES``, ``$OFFLINE_TEMPLATE_DIR``, then ``build/nbtemplates``
    of the source checkout (``make offline-template`` builds it there).
    """
    cands = [Path(os.environ[v]) for v in TEMPLATE_ENV if os.environ.get(v)]
    cands.append(Path(__file__).resolve().parents[2] / "build" / "nbtemplates")
    for c in cands:
        if (c / "offline_lab" / "index.html.j2").is_file():
            return c
    return None


def export_html(notebook: Any, output: str | os.PathLike[str], *,
                template_dir: str | os.PathLike[str] | None = None, overwrite: bool = False,
                inputs: Any = ()) -> Path:
    """Export an executed notebook to one offline HTML file (``offline_lab`` template).

    JSON embedded in the page (widget state and views) has ``<``, ``>``, ``&``, U+2028 and
    U+2029 escaped; the page carries precnb's marker and is written by the rules of
    :mod:`precnb._write`.

    Parameters
    ----------
    notebook : path-like or nbformat.NotebookNode
    output : path-like
    template_dir : path-like, optional
        Folder holding ``offline_lab/`` (default: :func:`offline_template_dir`).
    overwrite : bool
        Replace an existing precnb HTML output (never any other file).
    inputs : iterable of path-like
        Paths the page must stay out of (the notebook is added).

    Returns
    -------
    pathlib.Path

    Raises
    ------
    FileNotFoundError
        When the offline template has not been built.
    """
    import nbformat
    from nbconvert import HTMLExporter

    tdir = Path(template_dir) if template_dir is not None else offline_template_dir()
    if tdir is None or not (tdir / "offline_lab" / "index.html.j2").is_file():
        raise FileNotFoundError(
            "the offline_lab nbconvert template is not built: run `make offline-template` in a precnb "
            "checkout (or `bash tools/build_offline_template.sh build/nbtemplates`), or set "
            "PRECNB_NBTEMPLATES to the folder holding offline_lab/")
    from precnb._marks import html_marker
    from precnb._write import check_output, write_text
    from precnb.report._assets import escape_script_json

    protect = [*inputs, *([os.fspath(notebook)] if isinstance(notebook, (str, os.PathLike)) else [])]
    check_output(output, inputs=protect, overwrite=overwrite, content="html")
    nb = notebook if not isinstance(notebook, (str, os.PathLike)) else nbformat.read(str(notebook), as_version=4)
    # nbconvert escapes only "/" in the widget JSON it inlines; escape what ends or confuses a script too
    exporter = HTMLExporter(template_name="offline_lab", extra_template_basedirs=[str(tdir)],
                            filters={"escape_html_script": escape_script_json})
    html, _ = exporter.from_notebook_node(nb)
    head = html.find("<head>")
    if head < 0:
        raise ValueError("the exported page has no <head>: cannot mark it as precnb's")
    html = html[: head + 6] + "\n" + html_marker("notebook-html") + html[head + 6:]
    return write_text(Path(output).expanduser(), html, inputs=protect, overwrite=overwrite)

"""Hostile strings in charts and embedded JSON: U+2028 / U+2029 and markup.

U+2028 and U+2029 are legal in JSON strings but end a string literal for Vega's expression
parser: a module name holding one used to break two of the report's three charts ("Unexpected
token ILLEGAL"). Every chart spec of the report and of the explorer is compiled here with
Vega-Lite itself (vl-convert, the same compiler the page runs) on a run whose module, node and
tensor names hold them; JSON embedded in HTML (the report's script blocks, a notebook export's
widget state) has ``<``, ``>``, ``&``, U+2028 and U+2029 escaped.
"""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from tests.conftest import sample_path

pytest.importorskip("altair")
vlc = pytest.importorskip("vl_convert")

LS = "\u2028x\u2029y"
MARKUP = "</script><!--<script>"


def hostile_run():
    import precnb

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = precnb.open_run(sample_path("dp_nan"), progress=False, workers=1)
    old = "Torch.sqrt.0.forward"
    new = f"Torch.sqrt{LS}{MARKUP}.0.forward"
    labels = np.array([str(t).replace(old, new) for t in ds["tensor"].values], dtype=object)
    nodes = np.array([str(n).replace(old, new) for n in ds["node"].values], dtype=object)
    modules = ds["module"].values.astype(object).copy()
    modules[modules == "blocks.1.attn"] = f"blocks.1.attn{LS}{MARKUP}"
    modules[modules == "embed"] = f"embed{LS}"
    return ds.assign_coords(tensor=labels, node=("tensor", nodes), module=("tensor", modules)), new


def _compiles(spec: dict) -> None:
    from precnb.report._assets import vl_version

    vlc.vegalite_to_vega(spec, vl_version=vl_version())  # raises on "Unexpected token ILLEGAL"


def test_report_charts_compile_and_json_blocks_are_escaped():
    from precnb.report import to_html

    ds, node = hostile_run()
    page = to_html(ds)
    blocks = re.findall(r'<script type="application/json"([^>]*)>(.*?)</script>', page, re.S)
    assert len(blocks) >= 4  # three charts + the findings
    for _attrs, text in blocks:
        assert "\u2028" not in text and "\u2029" not in text
        assert "<" not in text and ">" not in text and "&" not in text
    specs = [json.loads(t) for a, t in blocks if "data-precnb-chart" in a]
    assert len(specs) == 3
    for spec in specs:
        _compiles(spec)
    findings = json.loads(next(t for a, t in blocks if 'id="precnb-findings"' in a))
    assert findings[0]["node"] == node  # the exact name, escapes undone by JSON.parse
    rows = {r.get("row") for s in specs for d in s.get("datasets", {}).values() for r in d}
    assert f"blocks.1.attn{LS}{MARKUP}" in rows and f"embed{LS}" in rows  # labels kept exactly


def test_explorer_charts_compile():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    import precnb

    ds, _ = hostile_run()
    ex = precnb.explore(ds)
    specs = [ex.heatmap.chart.spec, ex.lines.chart.spec]
    for name in ("rank", "step"):
        ex.filters.by.value = name
        specs.append(ex.heatmap.chart.spec)
    ex.tabs.selected_index = [p.title for p in ex.panels].index("Hierarchy")  # it draws when first shown
    specs.append(ex.hierarchy.chart.spec)
    for spec in specs:
        if spec:
            _compiles(spec)
    cells = ex.frame[ex.frame["row"] == f"blocks.1.attn{LS}{MARKUP}"][["row", "col"]].to_dict("records")
    assert cells
    ex.select_cells(cells[:1])  # clicking the hostile row selects it (labels exact on the way back)
    assert ex.row == f"blocks.1.attn{LS}{MARKUP}"


def test_selection_init_is_dropped_only_when_unsafe():
    from precnb.viz.selections import cell_selection

    assert cell_selection(value={"row": "a"}).param.to_dict()["value"] == [{"row": "a"}]
    assert "value" not in cell_selection(value={"row": f"a{LS}"}).param.to_dict()


def test_notebook_export_escapes_widget_json(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from precnb.report import notebooks
    from precnb.report._assets import escape_script_json

    assert escape_script_json('{"a": "</script><!--\u2028&"}') == \
        '{"a": "\\u003c/script\\u003e\\u003c!--\\u2028\\u0026"}'
    tdir = notebooks.offline_template_dir()
    if tdir is None:
        pytest.skip("the offline_lab nbconvert template is not built (make offline-template; it needs npm)")
    nb = nbformat.v4.new_notebook()
    evil = f"{MARKUP}{LS}&"
    state = {"state": {"m1": {"model_name": "HTMLModel", "model_module": "@jupyter-widgets/controls",
                              "model_module_version": "2.0.0", "state": {"value": evil}}},
             "version_major": 2, "version_minor": 0}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    cell = nbformat.v4.new_code_cell("w")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "m1", "version_major": 2, "version_minor": 0},
        "text/plain": "w"})]
    nb.cells.append(cell)
    out = notebooks.export_html(nb, tmp_path / "nb.html", template_dir=tdir)
    page = out.read_text(encoding="utf-8")
    blocks = re.findall(r'<script type="application/vnd.jupyter.widget-state\+json">(.*?)</script>', page, re.S)
    assert len(blocks) == 1
    assert "<" not in blocks[0] and ">" not in blocks[0] and "\u2028" not in blocks[0]
    assert json.loads(blocks[0])["state"]["m1"]["state"]["value"] == evil
    assert '<meta name="generator" content="precnb' in page[:2000]


def test_side_table_text_is_one_text_with_or_without_orjson_and_reads_back(monkeypatch):
    """construct/stacks attributes: compact JSON, the same text from orjson and the standard library, every
    string read back as it was (control characters, U+2028, emoji; lone surrogates as ASCII escapes)."""
    import json
    import sys

    from precnb.schema import side_text

    table = {"a\x00\x1f\x7f\"\\/\u2028\u2029é😀\b\f\n\r\t": "x\x01", "Module.a.A.forward.0": "",
             "stack": ["File a.py, line 1, in f, \n x = NaN", "</script>"]}
    lone = {"bad\ud800": "parent\udfff"}
    with_orjson = side_text(table), side_text(lone)
    monkeypatch.setitem(sys.modules, "orjson", None)  # ImportError: the standard-library path
    without = side_text(table), side_text(lone)
    assert with_orjson == without
    assert with_orjson[0] == json.dumps(table, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(with_orjson[0]) == table and json.loads(with_orjson[1]) == lone
    with_orjson[1].encode("ascii")  # escaped: writable as UTF-8 (zarr, netCDF)

"""The offline HTML report: content, escaping, no external URLs, size on a 1,000-rank run, CLI.

String-level checks (BeautifulSoup for structure). The same pages are opened in headless
Chromium with the network blocked in ``tests/browser/test_report_offline.py``.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, sample_path

bs4 = pytest.importorskip("bs4")
pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")
pytest.importorskip("altair")

import precnb  # noqa: E402
from precnb.report import Limits, to_html, write_html  # noqa: E402
from precnb.report._assets import package_text, vega_bundle  # noqa: E402

HOSTILE = "<script>alert(1)</script>"
HOSTILE_NODE = "Torch.sqrt.0.forward<img src=x onerror=alert(5)>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
URL_ATTRS = ("src", "href", "action", "data", "poster", "srcset", "formaction", "xlink:href")


def _open(*parts: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(sample_path(*parts), progress=False)


@pytest.fixture(scope="module")
def dp_nan():
    return _open("dp_nan")


@pytest.fixture(scope="module")
def nan_page(dp_nan):
    return to_html(dp_nan)


def hostile_run(ds):
    """dp_nan with script/markup in a module name, node, tensor labels, stack frame, path, module path."""
    old = "Torch.sqrt.0.forward"
    labels = np.array([str(t).replace(old, HOSTILE_NODE) for t in ds["tensor"].values], dtype=object)
    nodes = np.array([str(n).replace(old, HOSTILE_NODE) for n in ds["node"].values], dtype=object)
    modules = ds["module"].values.astype(object).copy()
    modules[modules == "blocks.1.attn"] = f"blocks.1.attn{HOSTILE}"
    out = ds.assign_coords(tensor=labels, node=("tensor", nodes), module=("tensor", modules))
    stacks = json.loads(out.attrs["stacks"])
    frames = stacks.pop(old, [])
    stacks[HOSTILE_NODE] = ["File /tmp/<img src=x onerror=alert(2)>.py, line 1, in <b>f</b>, \n"
                            " y = '</script><script>alert(3)</script>'", *frames]
    construct = json.loads(out.attrs["construct"])
    construct.pop(old, None)
    construct[HOSTILE_NODE] = "Module.blocks.1.attn<svg onload=alert(4)>.Attention.forward.0"
    out.attrs.update(stacks=json.dumps(stacks), construct=json.dumps(construct),
                     source=f"/data/run{HOSTILE}")
    return out


def parse(page: str):
    """BeautifulSoup of a page, without the <wbr> line-break hints (text stays contiguous)."""
    soup = bs4.BeautifulSoup(page, "html.parser")
    for w in soup.find_all("wbr"):
        w.decompose()
    soup.smooth()
    return soup


def txt(el) -> str:
    """Text of an element with whitespace collapsed."""
    return " ".join(el.get_text(" ").split())


def executable_scripts(soup) -> list[str]:
    return [s.get_text() for s in soup.find_all("script") if s.get("type") not in ("application/json",)]


def external_urls(soup) -> list[str]:
    """URLs in attributes that would make the browser fetch something."""
    bad = []
    for tag in soup.find_all(True):
        for attr in URL_ATTRS:
            val = tag.get(attr)
            if val is None:
                continue
            vals = val if isinstance(val, list) else [val]
            for v in vals:
                v = str(v).strip()
                if v.startswith("#") or v.startswith("data:"):  # in-page anchors and inline data fetch nothing
                    continue
                bad.append(f"<{tag.name} {attr}={v[:80]!r}>")
    for style in soup.find_all("style"):
        css = style.get_text()
        bad += [f"url({u[:80]})" for u in re.findall(r"url\(\s*['\"]?([^'\")]*)", css)
                if not u.startswith(("data:", "#"))]
        bad += re.findall(r"@import[^;]*", css)
    return bad


def chart_specs(soup) -> dict[str, dict]:
    return {s["data-precnb-chart"]: json.loads(s.get_text())
            for s in soup.find_all("script", attrs={"data-precnb-chart": True})}


# -- content ---------------------------------------------------------------------------------------


def test_nan_report_shows_the_finding_first_then_charts_then_tables(nan_page):
    soup = parse(nan_page)
    text = txt(soup)
    header = txt(soup.find("header"))
    for fact in ("dp_nan", "data_samples/dp_nan", "3 steps", "2 ranks", "609 tensors", "statistics", "mix",
                 "pytorch", "msprobe"):
        assert fact in header, fact
    ids = [s["id"] for s in soup.find_all("section")]
    assert ids == ["preflight", "findings", "charts", "tables", "json"]
    card = soup.select_one("#findings article.finding")
    assert card["data-kind"] == "nan_origin"
    card_text = txt(card)
    for what in ("NaN/Inf origin", "first NaN at step 1, rank 1", "Torch.sqrt.0.forward",
                 "Torch.sqrt.0.forward.output.0", "blocks.1.attn", "Module.blocks.1.attn.Attention.forward.0",
                 "Module.blocks.1.Block.forward.0",
                 "scores = scores + torch.sqrt(poison)", "_model.py", "Distributed.all_reduce.0.forward",
                 "inherited via communication", "created_by_node", "Hints", "masked_fill"):
        assert what in card_text, what
    assert card.select_one("code.where-step").get_text() == "1"
    assert card.select_one("code.where-rank").get_text() == "1"
    values = txt(card.select_one("table.values"))
    assert "nan" in values and "torch.float32" in values
    # the stack: the user frame first and highlighted, library frames dimmed
    frames = card.select("ol.stack li")
    assert "user" in frames[0]["class"] and "torch.sqrt(poison)" in frames[0].get_text()
    assert any("lib" in f["class"] for f in frames)
    # tables: records around the origin (the origin row highlighted), hot spots
    detail = soup.select_one("table.detail")
    focus = txt(detail.select_one("tr.focus"))
    assert "Torch.sqrt.0.forward.output.0" in focus and "nan" in focus
    assert "Torch.sqrt.0.forward.input.0" in txt(detail)
    assert soup.select_one("table.hotspots") is not None
    # machine-readable findings: strict JSON, parseable
    blob = json.loads(soup.find("script", id="precnb-findings").get_text())
    assert blob[0]["kind"] == "nan_origin" and blob[0]["node"] == "Torch.sqrt.0.forward"
    assert "anomal" in text.lower()


def test_charts_are_inline_vega_lite_with_a_linked_heat_map(nan_page):
    soup = parse(nan_page)
    specs = chart_specs(soup)
    assert set(specs) == {"chart-linked", "chart-series", "chart-ranks"}
    linked = specs["chart-linked"]
    assert "$schema" not in linked
    params = linked.get("params", [])
    cell = next(p for p in params if p["name"] == "cell")
    assert cell["select"]["type"] == "point" and cell["select"]["fields"] == ["row"]
    assert cell["value"] == [{"row": "blocks.1.attn"}]  # starts on the finding's module
    lines = linked["vconcat"][1]
    assert {"param": "cell", "empty": False} in [t.get("filter") for t in lines.get("transform", [])]
    for spec in specs.values():  # data inline, never fetched
        assert "url" not in json.dumps(spec.get("data", {}))
        assert spec.get("datasets")


def test_nan_series_chart_is_not_a_flat_line(nan_page):
    """sqrt(poison)'s output is 0 wherever it is finite: the chart adds the node's input, which shows the -1."""
    series = chart_specs(parse(nan_page))["chart-series"]
    rows = [r for d in series["datasets"].values() for r in d]
    assert {r["tensor"] for r in rows} == {"Torch.sqrt.0.forward.output.0", "Torch.sqrt.0.forward.input.0"}
    inputs = {(r["rank"], r["step"]): r["value"] for r in rows if r["tensor"].endswith("input.0")}
    assert inputs[(1, 1)] == 1.0 and inputs[(0, 1)] == 0.0  # the norm of the poison: 1 where the NaN is made
    layers = series["layer"]
    assert len(layers) == 3  # lines, points and the red rules of the NaN


def test_series_chart_without_nonfinite_has_no_empty_rule_layer():
    """An empty layer made vega warn 'Infinite extent for field "step"' in the comparison report."""
    import precnb.viz as viz

    base = _open("divergence", "target")
    frame = viz.series_frame(base, "Functional.gelu.0.forward.output.0")
    assert not frame["nonfinite"].any() and len(viz.line_chart(frame).to_dict()["layer"]) == 2


def test_one_vega_bundle_inlined_once_and_no_external_urls(nan_page):
    soup = parse(nan_page)
    assert external_urls(soup) == []
    assert soup.find_all("link") == [] and soup.find_all("iframe") == [] and soup.find_all("img") == []
    scripts = executable_scripts(soup)
    assert [s.strip() for s in scripts] == [vega_bundle().strip(), package_text("report.js").strip()]
    assert nan_page.count("window.vegaEmbed=") == 1
    assert "cdn.jsdelivr" not in nan_page and "unpkg.com" not in nan_page
    assert "fonts.googleapis" not in nan_page and "@font-face" not in nan_page
    assert "@media print" in nan_page


def test_hostile_names_are_escaped_everywhere(dp_nan):
    ds = hostile_run(dp_nan)
    f = precnb.nan_origin(ds)
    assert f.node == HOSTILE_NODE and f.module == f"blocks.1.attn{HOSTILE}"
    f.hints.append(f"check {HOSTILE} and <a href='http://evil.example'>this</a>")
    page = to_html(ds, findings=[f])
    soup = parse(page)
    # no markup from the data survives as markup
    assert "<script>alert" not in page and "</script><script>" not in page
    assert "<img src=x" not in page and "<svg onload" not in page and "<b>f</b>" not in page
    assert "<a href='http://evil" not in page
    assert soup.find_all("img") == [] and soup.find_all("svg") == []
    assert not soup.find_all(attrs={"onerror": True}) and not soup.find_all(attrs={"onload": True})
    assert external_urls(soup) == []
    scripts = executable_scripts(soup)
    assert [s.strip() for s in scripts] == [vega_bundle().strip(), package_text("report.js").strip()]
    # ... and is shown as text
    assert ESCAPED in page
    text = txt(soup)
    for shown in (f"blocks.1.attn{HOSTILE}", HOSTILE_NODE, "/data/run" + HOSTILE, "<b>f</b>",
                  "</script><script>alert(3)</script>", "<svg onload=alert(4)>", "http://evil.example"):
        assert shown in text, shown
    assert soup.select_one("code.where-module").get_text() == f"blocks.1.attn{HOSTILE}"
    # chart data and findings JSON keep the names exactly (escaped only for the HTML parser)
    specs = chart_specs(soup)
    rows = {r["row"] for d in specs["chart-linked"]["datasets"].values() for r in d if "row" in r}
    assert f"blocks.1.attn{HOSTILE}" in rows
    blob = json.loads(soup.find("script", id="precnb-findings").get_text())
    assert blob[0]["node"] == HOSTILE_NODE


def test_comparison_report_shows_both_sides(tmp_path):
    base, target = _open("divergence", "baseline"), _open("divergence", "target")
    out = write_html(target, tmp_path / "div.html", baseline=base, names=("baseline", "target"))
    page = out.read_text(encoding="utf-8")
    soup = parse(page)
    card = soup.select_one("article.finding")
    assert card["data-kind"] == "first_divergence"
    t = txt(card)
    assert "Functional.gelu.0.forward" in t and "blocks.0.mlp" in t
    values = card.select_one("table.values")
    assert [th.get_text() for th in values.select("thead th")][1:] == ["baseline", "target"]
    assert "1.38941" in values.get_text() and "1.39062" in values.get_text()
    assert "rel_diff" in t and "Distributed.all_reduce.1.forward" in t
    assert "F.gelu(h.to(dtype))" in t  # the stack frame of the origin
    runs = [r.select_one(".role").get_text() for r in soup.select(".run")]
    assert runs == ["baseline", "target"]
    detail = soup.select_one("table.detail")
    heads = [th.get_text() for th in detail.select("th")]
    assert "rel. diff" in heads and "norm (target / baseline)" in heads  # one cell: target over baseline
    focus = detail.select_one("tr.focus")
    max_cell = focus.select("td")[6]
    assert [s.get_text() for s in max_cell.select("span")] == ["1.39062", "1.38941"]
    assert "<wbr>" not in str(detail.select_one("td.name")).replace("<wbr/>", "<wbr>").split(".forward")[0]
    specs = chart_specs(soup)
    series = specs["chart-series"]
    names = {r.get("run") for d in series["datasets"].values() for r in d}
    assert names == {"baseline", "target"}
    assert external_urls(soup) == []


def test_dp_sum_report_with_layout_has_ratio_hint_and_replica_check():
    base, target = _open("dp_sum", "baseline"), _open("dp_sum", "target")
    page = to_html(target, baseline=base, layout="dp=2")
    soup = parse(page)
    kinds = [a["data-kind"] for a in soup.select("article.finding")]
    assert kinds == ["first_divergence", "none"]
    text = txt(soup)
    assert "summed, not averaged" in text and "2 is the data-parallel world size" in text
    assert "Tensor.div_.0.forward" in text and "all replicas agree" in text
    assert "Structural differences: 11 node(s)" in text
    assert "layout target: world 2" in text


def test_tp_report_merges_shards_before_comparing():
    page = to_html(_open("tp", "tp2"), baseline=_open("tp", "tp1"), layout="tp=2")
    soup = parse(page)
    text = txt(soup)
    assert "target shards merged" in text
    assert [a["data-kind"] for a in soup.select("article.finding")] == ["none", "none"]
    assert "no value divergence beyond tolerance" in text and "all replicas agree" in text
    assert soup.select_one(".verdict").get_text() == "nothing found"


def test_monitor_report_lists_anomalies():
    page = to_html(_open("monitor"))
    soup = parse(page)
    kinds = [a["data-kind"] for a in soup.select("article.finding")]
    assert kinds == ["loss_spike", "nan_origin", "anomaly"]  # rank 1's loss x1000 at step 1 comes first
    table = txt(soup.select_one("table.anomalies"))
    assert "actv_grad/lm_head.input" in table and "spike" in table and "nonfinite" in table
    assert "actv/blocks.1.attn.output" in txt(soup.select("article.finding")[1])


def test_healthy_run_says_nothing_found_and_what_was_checked():
    page = to_html(_open("healthy"))
    soup = parse(page)
    assert soup.select_one(".verdict").get_text() == "nothing found"
    assert [a["data-kind"] for a in soup.select("article.finding")] == ["none"]
    assert "no NaN and no unexpected ±inf" in txt(soup)
    assert "chart-linked" in chart_specs(soup)


def test_findings_argument_and_combined_runs(dp_nan):
    page = to_html(dp_nan, findings=[])
    soup = parse(page)
    assert soup.select("article.finding") == [] and "No diagnosis was run" in page
    f = precnb.nan_origin(dp_nan)
    page = to_html(dp_nan, findings=f.to_dict())  # a Finding dict (e.g. from `precnb nan --json`)
    assert "Torch.sqrt.0.forward" in parse(page).select_one("article").get_text()
    # what the explorer's "Export report" passes: one dataset holding runs
    both = precnb.combine_runs({"gpu": _open("divergence", "baseline"), "npu": _open("divergence", "target")})
    soup = parse(to_html(both))
    assert [r.select_one(".rname").get_text() for r in soup.select(".run")] == ["gpu", "npu"]
    assert soup.select_one("article.finding")["data-kind"] == "first_divergence"


def test_step_offset_report(dp_nan):
    base = _open("divergence", "baseline")
    target = base.assign_coords(step=base["step"] + 10)  # a resumed run whose counter moved on
    soup = parse(to_html(target, baseline=base, step_offset="auto"))
    text = txt(soup)
    assert "target step = baseline step + 10 (found automatically)" in text
    assert soup.select_one("article.finding")["data-kind"] == "none"


def test_limits_bound_the_tables(dp_nan):
    page = to_html(dp_nan, limits=Limits(top_k=5, detail_rows=10, table_rows=3))
    soup = parse(page)
    assert len(soup.select("table.detail tbody tr")) <= 10
    rows = {r["row"] for d in chart_specs(soup)["chart-linked"]["datasets"].values() for r in d if "row" in r}
    assert len(rows) <= 5


# -- CLI -------------------------------------------------------------------------------------------


def test_cli_report(tmp_path, capsys):
    from precnb.cli import main

    out = tmp_path / "r.html"
    assert main(["report", str(sample_path("dp_nan")), "-o", str(out)]) == 0
    assert "self-contained" in capsys.readouterr().out
    assert "Torch.sqrt.0.forward" in out.read_text(encoding="utf-8")
    out2 = tmp_path / "d.html"
    code = main(["report", str(sample_path("divergence", "target")), "--baseline",
                 str(sample_path("divergence", "baseline")), "-o", str(out2), "--title", "gelu in bf16"])
    assert code == 0
    page = out2.read_text(encoding="utf-8")
    assert "<title>precnb report — gelu in bf16</title>" in page and "Functional.gelu.0.forward" in page
    assert main(["report", str(sample_path("dp_nan")), "--layout", "tp=3", "-o", str(tmp_path / "x.html")]) == 2
    assert "not divisible" in capsys.readouterr().err
    assert main(["report", str(sample_path("dp_nan")), "--baseline-layout", "tp=2",
                 "-o", str(tmp_path / "y.html")]) == 2
    assert not (tmp_path / "x.html").exists()


# -- size on a large run ---------------------------------------------------------------------------


@pytest.mark.slow
def test_size_bounded_on_a_1000_rank_run(dp_nan):
    """A real sample tiled along rank to 1,000 ranks: the page stays far below 10 MB."""
    big = dp_nan.isel(rank=np.arange(1000) % dp_nan.sizes["rank"]).assign_coords(rank=np.arange(1000))
    t0 = time.time()
    page = to_html(big, title="dp_nan × 500")
    elapsed = time.time() - t0
    size = len(page.encode("utf-8"))
    small = len(to_html(dp_nan).encode("utf-8"))
    out = ROOT / "test-output"
    out.mkdir(exist_ok=True)
    (out / "report_1000_ranks.html").write_text(page, encoding="utf-8")
    (out / "report_sizes.json").write_text(json.dumps(
        {"ranks_1000_bytes": size, "ranks_2_bytes": small, "ranks_1000_seconds": round(elapsed, 1)}, indent=2))
    assert size < 10_000_000, size
    assert size < 3 * small  # aggregation: 500× the ranks, a small constant more bytes
    soup = parse(page)
    assert "1000 ranks" in txt(soup.find("header"))
    specs = chart_specs(soup)
    ranks = {r.get("ranks") for d in specs["chart-linked"]["datasets"].values() for r in d if "ranks" in r}
    assert 1 < len(ranks) <= Limits().rank_groups  # rank buckets, not 1,000 lines
    cols = {r.get("col") for d in specs["chart-ranks"]["datasets"].values() for r in d if "col" in r}
    assert len(cols) <= Limits().rank_cols
    assert external_urls(soup) == []
    assert Path(out / "report_1000_ranks.html").stat().st_size == size

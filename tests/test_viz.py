"""precnb.viz: frames (bounded aggregation, worst-record tracking), charts, selections, hierarchy."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

import precnb
from precnb.schema import SCHEMA_VERSION, validate
from tests.conftest import sample_path

alt = pytest.importorskip("altair")
viz = pytest.importorskip("precnb.viz")

MODULES = ["embed", "blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", "lm_head"]


# -- synthetic runs (no files needed) -----------------------------------------------------------
def make_run(n_steps: int = 4, n_ranks: int = 3, *, nan_at: tuple[int, int, str] | None = None,
             seed: int = 0) -> xr.Dataset:
    """A valid canonical run: per module a forward and a backward Linear node (input, output)."""
    rng = np.random.default_rng(seed)
    labels, coords = [], {k: [] for k in ("node", "module", "api", "kind", "direction", "role",
                                          "dtype", "shape", "parent", "call", "micro_step")}
    construct, stacks = {}, {}
    for direction in ("forward", "backward"):
        mods = MODULES if direction == "forward" else MODULES[::-1]
        for m in mods:
            node = f"Module.{m}.Linear.{direction}.0"
            parent = f"Module.{m.rsplit('.', 1)[0]}.Block.{direction}.0" if "." in m else ""
            construct[node] = parent
            if parent:
                construct.setdefault(parent, "")
            stacks[node] = [f"File model.py, line {10 + len(stacks)}, in forward, y = self.{m}(x)"]
            for role in ("input", "output"):
                labels.append(f"{node}.{role}.0")
                for k, v in (("node", node), ("module", m), ("api", "Linear"), ("kind", "module"),
                             ("direction", direction), ("role", role), ("dtype", "torch.float32"),
                             ("shape", "[4, 8]"), ("parent", parent), ("call", 0), ("micro_step", -1)):
                    coords[k].append(v)
    t = len(labels)
    shape = (n_steps, n_ranks, t)
    norm = rng.uniform(1, 10, t)[None, None, :] * (1 + 0.01 * np.arange(n_steps))[:, None, None]
    norm = norm * (1 + 1e-3 * rng.standard_normal(shape))
    data = {"norm": norm, "max": norm / 4, "min": -norm / 4, "mean": norm / 100}
    seq = np.broadcast_to(np.arange(t, dtype=np.int32), shape).copy()
    if nan_at is not None:
        s, r, tensor = nan_at
        j = labels.index(tensor)
        later = seq[s, r] >= seq[s, r, j]
        for v in data.values():
            v[s, r, later] = np.nan
            v[s + 1:, :, :] = np.nan
    ds = xr.Dataset(
        {**{k: (("step", "rank", "tensor"), v) for k, v in data.items()},
         "present": (("step", "rank", "tensor"), np.ones(shape, bool)),
         "null_stats": (("step", "rank", "tensor"), np.zeros(shape, np.uint8)),
         "seq": (("step", "rank", "tensor"), seq),
         "numel": (("step", "rank", "tensor"), np.full(shape, 32, np.int64))},
        coords={"step": np.arange(n_steps, dtype=np.int64), "rank": np.arange(n_ranks, dtype=np.int64),
                "tensor": np.array(labels, dtype=object),
                **{k: ("tensor", np.array(v, dtype=object if isinstance(v[0], str) else np.int64))
                   for k, v in coords.items()}},
        attrs={"precnb_schema": SCHEMA_VERSION, "source_format": "synthetic",
               "construct": json.dumps(construct), "stacks": json.dumps(stacks)})
    return validate(ds)


def tile_ranks(ds: xr.Dataset, n: int) -> xr.Dataset:
    """Repeat ranks up to *n* (as benchmarks/bench_explorer.py does), with a small jitter."""
    reps = -(-n // ds.sizes["rank"])
    rng = np.random.default_rng(0)
    out = {}
    for name, var in ds.data_vars.items():
        arr = np.tile(var.values, (1, reps, 1))[:, :n]
        if var.dtype.kind == "f":
            arr = arr * (1 + 1e-3 * rng.standard_normal((1, n, 1)))
        out[name] = (var.dims, arr)
    coords = {k: v for k, v in ds.coords.items() if k != "rank"}
    coords["rank"] = np.arange(n, dtype=np.int64)
    return xr.Dataset(out, coords=coords, attrs=ds.attrs)


NAN_TENSOR = "Module.blocks.1.attn.Linear.forward.0.output.0"


@pytest.fixture(scope="module")
def nan_run():
    return make_run(nan_at=(2, 1, NAN_TENSOR))


@pytest.fixture(scope="module")
def big_run():
    return tile_ranks(make_run(n_steps=5, n_ranks=2, nan_at=(3, 1, NAN_TENSOR)), 1000)


# -- import hygiene ---------------------------------------------------------------------------
def test_import_precnb_does_not_import_altair_or_widgets():
    code = ("import sys, precnb; precnb.open_run; "
            "print(any(m in sys.modules for m in ('altair', 'ipywidgets', 'anywidget', 'precnb.viz')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- heat-map frames --------------------------------------------------------------------------
def test_heatmap_frame_rows_by_step_and_nonfinite_worst_record(nan_run):
    df = viz.heatmap_frame(nan_run, color="nonfinite")
    assert set(df["row"]) == set(MODULES)
    assert sorted(df["col"].unique(), key=int) == ["0", "1", "2", "3"]
    assert len(df) == len(MODULES) * 4
    cell = df[(df["row"] == "blocks.1.attn") & (df["col"] == "2")].iloc[0]
    # the earliest non-finite record (execution order) of that module at step 2, on rank 1
    assert (cell["tensor"], cell["worst_step"], cell["worst_rank"]) == (NAN_TENSOR, 2, 1)
    assert cell["nonfinite"] == cell["value"] > 0
    before = df[(df["col"] == "1")]
    assert (before["nonfinite"] == 0).all() and (before["tensor"] == "").all()
    # rows come in execution order: the embedding's forward first
    assert df.sort_values("row_order")["row"].iloc[0] == "embed"


def test_heatmap_frame_stat_colour_picks_largest_magnitude(nan_run):
    df = viz.heatmap_frame(nan_run, stat="norm", rows="tensor", steps=[0], ranks=[0])
    ds0 = nan_run.sel(step=0, rank=0)
    top = df.sort_values("value", ascending=False).iloc[0]
    assert top["value"] == pytest.approx(float(np.abs(ds0["norm"]).max()))
    assert top["tensor"] == top["row"]
    assert top["value_text"] != "—"


def test_heatmap_frame_top_k_and_focus(nan_run):
    df = viz.heatmap_frame(nan_run, rows="tensor", top_k=3,
                           focus={"step": 0, "rank": 2, "tensor": "Module.embed.Linear.forward.0.input.0"})
    assert df["row"].nunique() == 3
    assert "Module.embed.Linear.forward.0.input.0" in set(df["row"])
    f = df[df["focus"]]
    assert len(f) == 1 and f.iloc[0]["col"] == "0"


def test_heatmap_frame_filters(nan_run):
    keep = np.asarray(nan_run["direction"].values == "backward")
    df = viz.heatmap_frame(nan_run, tensors=keep, steps=[1, 2], ranks=[0, 1], color="nonfinite")
    assert set(df["col"]) == {"1", "2"}
    assert (df["records"] == 2 * 2).all()  # 2 backward tensors per module × 2 ranks


def test_heatmap_frame_reldiff_finds_the_perturbed_tensor():
    base = make_run()
    target = base.copy(deep=True)
    label = "Module.blocks.0.mlp.Linear.backward.0.output.0"
    target["norm"].loc[dict(step=1, rank=2, tensor=label)] *= 1.5
    both = precnb.combine_runs({"gpu": base, "npu": target})
    df = viz.heatmap_frame(both, run="npu", baseline="gpu", color="reldiff")
    hot = df.sort_values("value", ascending=False).iloc[0]
    assert (hot["row"], hot["col"], hot["tensor"], hot["worst_rank"]) == ("blocks.0.mlp", "1", label, 2)
    assert hot["value"] == pytest.approx(0.5 / 1.5, rel=1e-6)
    assert (df[df["col"] == "0"]["value"] == 0).all()
    # the same with two single-run datasets
    df2 = viz.heatmap_frame(target, baseline=base, color="reldiff")
    assert df2["value"].max() == pytest.approx(hot["value"])
    with pytest.raises(ValueError, match="baseline"):
        viz.heatmap_frame(base, color="reldiff")


def test_heatmap_frame_is_bounded_on_1000_ranks(big_run):
    by_step = viz.heatmap_frame(big_run, top_k=40)
    assert len(by_step) <= 40 * 48 and by_step["col"].nunique() == 5
    by_rank = viz.heatmap_frame(big_run, by="rank", color="nonfinite", top_k=40)
    assert len(by_rank) <= 40 * 32 <= 2000
    labels = by_rank.sort_values("col_order")["col"].unique().tolist()
    assert labels[0] == "0-31" and labels[-1] == "992-999" and len(labels) == 32
    # the NaN on rank 1 at step 3 is still named by its bucket's worst record
    hit = by_rank[(by_rank["row"] == "blocks.1.attn") & (by_rank["col"] == "0-31")].iloc[0]
    assert hit["tensor"] == NAN_TENSOR and hit["worst_step"] == 3 and hit["nonfinite"] > 0
    cube = viz.cube_frame(big_run, rows="tensor", step_groups=2, rank_groups=4, top_k=10)
    assert len(cube) == 10 * 2 * 4


def test_heatmap_frame_empty_selection(nan_run):
    assert len(viz.heatmap_frame(nan_run, steps=[99])) == 0


# -- charts -----------------------------------------------------------------------------------
def test_heatmap_chart_spec_has_named_cell_selection(nan_run):
    df = viz.heatmap_frame(nan_run, color="nonfinite", focus={"step": 2, "rank": 1, "tensor": NAN_TENSOR})
    chart = viz.heatmap_chart(df, selected={"row": "blocks.1.attn", "col": "2"})
    spec = chart.to_dict()
    (param,) = spec["params"]
    assert param["name"] == viz.CELL and param["select"]["fields"] == ["row", "col"]
    assert "value" not in param  # the selected cell is outlined through the data (a click on it still counts)
    data = next(iter(spec["datasets"].values()))
    assert [(d["row"], d["col"]) for d in data if d["selected"]] == [("blocks.1.attn", "2")]
    assert spec["mark"]["type"] == "rect"
    assert len(data) == len(df)
    assert viz.heatmap_chart(df, selection=False).to_dict().get("params") is None


def test_line_chart_layers_and_params(nan_run):
    s = viz.series_frame(nan_run, NAN_TENSOR)
    spec = viz.line_chart(s).to_dict()
    names = {p["name"] for p in spec["params"]}
    assert names == {viz.SPAN, viz.PICK}
    assert len(spec["layer"]) == 3


def test_linked_chart_filters_lines_in_pure_vega_lite(nan_run):
    cube = viz.cube_frame(nan_run, color="nonfinite", rank_groups=3,
                          focus={"step": 2, "rank": 1, "tensor": NAN_TENSOR})
    chart = viz.linked_chart(cube)
    spec = chart.to_dict()
    _heat, lines = spec["vconcat"]
    (param,) = spec["params"]
    assert param["select"]["fields"] == ["row"] and param["value"] == [{"row": "blocks.1.attn"}]
    assert {"filter": {"param": "cell", "empty": False}} in lines["transform"]
    vlc = pytest.importorskip("vl_convert")
    svg = vlc.vegalite_to_svg(spec)  # renders offline, no kernel
    assert "<svg" in svg


# -- series, detail, evidence -----------------------------------------------------------------
def test_series_frame_one_line_per_rank_and_nonfinite_flag(nan_run):
    s = viz.series_frame(nan_run, NAN_TENSOR)
    assert set(s["series"]) == {"rank 0", "rank 1", "rank 2"}
    r1 = s[s["rank"] == 1].set_index("step")
    assert r1.loc[2, "nonfinite"] and np.isnan(r1.loc[2, "value"]) and not r1.loc[1, "nonfinite"]


def test_series_frame_limits_lines_on_many_ranks(big_run):
    ds = big_run.copy(deep=True)
    t = "Module.lm_head.Linear.forward.0.output.0"
    ds["norm"].loc[dict(step=1, rank=777, tensor=t)] *= 50
    s = viz.series_frame(ds, t, keep_ranks=[5], max_lines=4, steps=[0, 1, 2])
    ranks = set(s["rank"])
    assert {5, 777, -1} <= ranks and len(ranks) == 5  # 4 ranks + the median line
    assert s.attrs["ranks_total"] == 1000


def test_series_frame_per_run():
    a, b = make_run(), make_run(seed=1)
    s = viz.series_frame(precnb.combine_runs({"gpu": a, "npu": b}), NAN_TENSOR, ranks=[0])
    assert set(s["series"]) == {"gpu · rank 0", "npu · rank 0"}


def test_detail_frame_and_evidence(nan_run):
    tensors = [t for t in nan_run["tensor"].values if ".blocks.1.attn." in t]
    d = viz.detail_frame(nan_run, step=2, rank=1, tensors=tensors)
    assert list(d["tensor"]) == sorted(tensors, key=lambda t: int(nan_run["seq"].sel(
        step=2, rank=1, tensor=t)))
    row = d.set_index("tensor").loc[NAN_TENSOR]
    assert row["nonfinite"] and row["dtype"] == "torch.float32" and row["shape"] == "[4, 8]"
    ev = viz.tensor_evidence(nan_run, NAN_TENSOR)
    assert ev["module_path"] == ["Module.blocks.1.Block.forward.0"]
    assert ev["stack"] and "self.blocks.1.attn" in ev["stack"][0]


def test_detail_frame_against_baseline():
    a = make_run()
    b = a.copy(deep=True)
    b["max"].loc[dict(step=0, rank=0, tensor=NAN_TENSOR)] *= 2
    both = precnb.combine_runs({"gpu": a, "npu": b})
    d = viz.detail_frame(both, step=0, rank=0, tensors=[NAN_TENSOR], run="npu", baseline="gpu")
    assert d.loc[0, "max"] == pytest.approx(2 * d.loc[0, "max_gpu"])
    assert d.loc[0, "rel_diff"] == pytest.approx(0.5)


# -- hierarchy --------------------------------------------------------------------------------
def test_hierarchy_frame_propagates_counts(nan_run):
    h = viz.hierarchy_frame(nan_run, counts="nonfinite").set_index("node")
    leaf = h.loc["Module.blocks.1.attn.Linear.forward.0"]
    block = h.loc["Module.blocks.1.Block.forward.0"]
    assert leaf["count"] > 0 and block["count"] >= leaf["count"]
    assert block["depth"] == 1 and leaf["depth"] == 2 and leaf["parent"] == block.name
    assert block["x0"] <= leaf["x0"] < leaf["x1"] <= block["x1"]
    # the embedding is clean until step 3, where every record (2 tensors × 3 ranks) is NaN
    assert h.loc["Module.embed.Linear.forward.0", "count"] == 2 * 3
    spec = viz.hierarchy_chart(h.reset_index()).to_dict()
    assert spec["params"][0]["name"] == viz.NODE


def test_hierarchy_frame_from_module_paths_without_construct(nan_run):
    ds = nan_run.copy()
    ds.attrs["construct"] = "{}"
    h = viz.hierarchy_frame(ds, counts="nonfinite").set_index("node")
    assert h.loc["blocks", "count"] >= h.loc["blocks.1", "count"] >= h.loc["blocks.1.attn", "count"] > 0


def test_real_sample_nan_run_frames():
    ds = precnb.open_run(sample_path("dp_nan"))
    f = precnb.nan_origin(ds)
    df = viz.heatmap_frame(ds, color="events", focus={"step": f.step, "rank": f.rank, "tensor": f.tensor})
    hit = df[df["focus"]].iloc[0]
    assert hit["col"] == str(f.step) and hit["tensor"] == f.tensor and hit["worst_rank"] == f.rank
    h = viz.hierarchy_frame(ds, counts="events")
    assert h.set_index("node").loc["Module.blocks.1.attn.Attention.forward.0", "count"] > 0

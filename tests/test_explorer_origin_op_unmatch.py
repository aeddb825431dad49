"""Issue 51 items 4-7 without a browser: the same op across ranks, Unmatch, heat-map row order, the detail table."""

from __future__ import annotations

import warnings

import pytest

from tests.conftest import sample_path

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SHIFT = "Torch.sqrt.0.forward.output.0"


@pytest.fixture(scope="module")
def shifted():
    import precnb

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = precnb.open_run(sample_path("rank_shift"), progress=False)
    j = ds.indexes["tensor"].get_loc("Torch.sqrt.1.forward.output.0")
    p = ds["present"].values.copy()
    p[0, 0, j] = False  # rank 0's record of rank 1's NaN op at step 0: gone
    return ds, ds.assign(present=(ds["present"].dims, p))


def test_same_op_series_follows_the_op_and_says_where_it_is_missing(shifted):
    from precnb.viz.series import same_op_series

    ds, cut = shifted
    full = same_op_series(ds, SHIFT, step=1, rank=1)
    got = {(int(r), int(s)): t for r, s, t in zip(full["rank"], full["step"], full["tensor"], strict=True)}
    assert got == {(0, 0): "Torch.sqrt.1.forward.output.0", (0, 1): "Torch.sqrt.1.forward.output.0",
                   (1, 0): SHIFT, (1, 1): SHIFT}
    assert full.attrs["missing"] == {} and full.attrs["relabelled"] == {0: ["Torch.sqrt.1.forward.output.0"]}
    part = same_op_series(cut, SHIFT, step=1, rank=1)
    assert part.attrs["missing"] == {0: [0]}
    row = part[(part["rank"] == 0) & (part["step"] == 1)].iloc[0]
    assert row["value"] == pytest.approx(float(ds["norm"].sel(step=1, rank=0, tensor="Torch.sqrt.1.forward.output.0")))


def test_explorer_chart_caption_names_the_ops_label_per_rank(shifted):
    import precnb

    ex = precnb.explore(shifted[1])
    assert (ex.step, ex.rank, ex.tensor) == (1, 1, SHIFT)
    assert set(ex.series.loc[ex.series["rank"] == 0, "tensor"]) == {"Torch.sqrt.1.forward.output.0"}
    cap = ex.lines.caption.value
    assert "on rank 0 it is Torch.sqrt.1.forward.output.0" in cap and "rank 0 has no such op at step 0" in cap


def test_unmatch_of_the_origin_call_is_unpaired_not_glue_and_drops_the_stale_cause():
    import precnb

    ex = precnb.explore(sample_path("xfw", "ms_bug"), baseline=sample_path("xfw", "pt"))
    node = ex.current_finding.node
    assert node == "Tensor.__add__.6.forward" and "scalar argument" in ex.bar.why.value
    al = ex.panel("Alignment")
    al.level.value = "calls"
    al.pick(right=node)
    assert al.do_unmatch() is not None
    f = ex.current_finding
    assert "scalar_argument" not in [c.get("cause") for c in f.causes] and "scalar argument" not in ex.bar.why.value
    assert "runs in target but not in baseline" in f.reason
    al.draw()
    rows = al.rows[al.rows["name"] == node]
    assert set(rows["status"]) == {"unpaired"} and set(rows["how"]) == {"unmatched by hand"}
    assert "(unpaired: unmatched by hand)" in al.status.value


def test_rows_outside_any_module_come_last_in_their_group():
    import precnb

    ex = precnb.explore(sample_path("drift", "dump"))
    fr = ex.frame.sort_values("row_order")
    fwd = fr.loc[fr["group"] == "forward", "row"].drop_duplicates().tolist()
    assert "(none)" in fwd and fwd[-1] == "(none)", fwd


def test_detail_table_keeps_the_origin_and_its_stack_close():
    import precnb

    ex = precnb.explore(sample_path("megatron", "tp2pp2_scaled"), baseline=sample_path("megatron", "tp1pp1"))
    page = ex.record.detail.html.value
    assert len(ex.record.detail.frame) <= 8 and "<tr class='focus'>" in page
    assert "role · dtype · shape" in page and "<th class='l'>shape</th>" not in page
    assert page.index("<tr class='focus'>") < page.index("class='stack'")

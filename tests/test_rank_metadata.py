"""Issue 26, item 1: the metadata of a finding's tensor is that tensor's own step and rank's.

``data_samples/rank_shift``: rank 0 runs one extra ``Torch.sqrt`` early, so on rank 0 the label
``Torch.sqrt.0.forward`` is the logging op (``blocks.0.attn_norm``, a scalar) while on rank 1 it is
the attention op that makes the NaN (``blocks.0.attn``, ``[2, 2, 8, 8]``). Every answer is checked
against that rank's own construct.json / dump.json / stack.json.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import precnb
from precnb.schema import entry_meta, entry_stack
from tests._inprocess_cli import run_cli
from tests.conftest import sample_path

NODE = "Torch.sqrt.0.forward"
LABEL = f"{NODE}.output.0"


def _rank_files(step: int, rank: int) -> dict:
    d = sample_path("rank_shift", f"step{step}", f"rank{rank}")
    dump = json.loads((d / "dump.json").read_text())["data"]
    construct = json.loads((d / "construct.json").read_text())
    raw = json.loads((d / "stack.json").read_text())
    stack = next((frames for nodes, frames in raw.values() if NODE in nodes), []) if "0" in raw else raw.get(NODE, [])
    parent = construct[NODE]
    return {"parent": parent, "module": parent.split(".", 1)[1].rsplit(".", 3)[0],
            "shape": json.dumps(dump[NODE]["output"][0]["shape"]),
            "dtype": dump[NODE]["output"][0]["dtype"], "stack": stack}


@pytest.fixture(scope="module")
def run():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return precnb.open_run(sample_path("rank_shift"), progress=False)


@pytest.fixture(scope="module")
def triage():
    return precnb.diagnose(sample_path("rank_shift"))


def test_the_sample_shifts_the_label_onto_another_op():
    gt = json.loads(sample_path("rank_shift", "ground_truth.json").read_text())
    one, zero = _rank_files(1, 1), _rank_files(1, 0)
    assert one["module"] == "blocks.0.attn" and zero["module"] == "blocks.0.attn_norm"
    assert one["shape"] == "[2, 2, 8, 8]" and zero["shape"] == "[]"
    assert one["stack"][0] != zero["stack"][0]
    assert (gt["faults"][0]["step"], gt["faults"][0]["rank"], gt["faults"][0]["node"]) == (1, 1, NODE)


@pytest.mark.parametrize("rank", [0, 1])
def test_every_entry_has_its_own_ranks_metadata(run, rank):
    want = _rank_files(1, rank)
    got = entry_meta(run, LABEL, 1, rank)
    assert (got["module"], got["parent"], got["shape"], got["dtype"]) == (
        want["module"], want["parent"], want["shape"], want["dtype"])
    assert entry_stack(run, NODE, 1, rank) == want["stack"]


def test_nan_origin_names_that_ranks_module_shape_and_stack(triage):
    f = triage.finding
    own = _rank_files(1, 1)
    assert (f.kind, f.step, f.rank, f.node, f.tensor) == ("nan_origin", 1, 1, NODE, LABEL)
    assert f.module == own["module"] == "blocks.0.attn"
    assert f.values["entry"]["shape"] == own["shape"] and f.values["entry"]["dtype"] == own["dtype"]
    assert f.evidence["stack"] == own["stack"]
    assert f.evidence["module_path"][0] == own["parent"]
    assert any(c["cause"] == "sqrt_domain" for c in f.causes)


def test_the_finding_says_the_label_names_another_op_on_rank_0(triage):
    f = triage.finding
    zero = _rank_files(1, 0)
    [other] = f.evidence["label_elsewhere"]
    assert other["ranks"] == [0] and other["module"] == zero["module"] and other["shape"] == zero["shape"]
    hint = next(h for h in f.hints if "names another op" in h)
    assert "rank 0" in hint and "blocks.0.attn_norm" in hint and "call counters" in hint
    d = json.loads(f.to_json())
    assert d["module"] == "blocks.0.attn" and d["evidence"]["label_elsewhere"][0]["ranks"] == [0]


def test_cli_json_gives_the_same_metadata(tmp_path):
    proc = run_cli("nan", sample_path("rank_shift"), "--json")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    d = json.loads(out)
    f = d["findings"][0] if "findings" in d else d
    own = _rank_files(1, 1)
    assert (f["module"], f["values"]["entry"]["shape"], f["evidence"]["stack"][0]) == (
        own["module"], own["shape"], own["stack"][0])


def test_joined_and_combined_runs_keep_each_entrys_metadata(run):
    from precnb.combine import combine_runs, concat_steps, select_run

    parts = [precnb.open_run(sample_path("rank_shift"), steps=[s], progress=False) for s in (0, 1)]
    joined = concat_steps(parts)
    for rank in (0, 1):
        assert entry_meta(joined, LABEL, 1, rank) == entry_meta(run, LABEL, 1, rank)
        assert entry_stack(joined, NODE, 1, rank) == entry_stack(run, NODE, 1, rank)
    both = combine_runs({"a": precnb.open_run(sample_path("healthy"), progress=False), "b": run})
    b = select_run(both, "b")
    for rank in (0, 1):
        assert entry_meta(b, LABEL, 1, rank)["module"] == _rank_files(1, rank)["module"]
        assert entry_stack(b, NODE, 1, rank) == _rank_files(1, rank)["stack"]


def test_step_offset_and_merge_move_the_metadata_with_their_entries(run):
    from precnb.schema import shift_entry_changes

    moved = run.assign_coords(step=run["step"] + 5)
    moved.attrs = shift_entry_changes({k: v for k, v in run.attrs.items()}, -5)
    assert entry_meta(moved, LABEL, 6, 1)["module"] == "blocks.0.attn"
    assert entry_meta(moved, LABEL, 6, 0)["module"] == "blocks.0.attn_norm"


def test_detail_frame_and_evidence_are_the_ranks_own(run):
    from precnb.viz import detail_frame, tensor_evidence

    for rank in (0, 1):
        own = _rank_files(1, rank)
        df = detail_frame(run, step=1, rank=rank, focus=LABEL)
        row = df[df["tensor"] == LABEL].iloc[0]
        assert (row["module"], row["shape"]) == (own["module"], own["shape"])
        ev = tensor_evidence(run, LABEL, 1, rank)
        assert (ev["module"], ev["shape"], ev["stack"]) == (own["module"], own["shape"], own["stack"])
        assert [g["ranks"] for g in ev["elsewhere"]] == [[1 - rank]]


def test_heat_map_puts_each_entry_in_its_own_ranks_module_row(run):
    from precnb.viz import heatmap_frame

    df = heatmap_frame(run, by="rank", rows="module", color="nonfinite", steps=[1])
    rank1 = df[(df["rank_lo"] <= 1) & (df["rank_hi"] >= 1)]
    attn = rank1[rank1["row"] == "blocks.0.attn"]
    assert (attn["tensor"] == LABEL).any()  # the NaN origin sits in its own rank's module row
    norm = rank1[rank1["row"] == "blocks.0.attn_norm"]
    assert not (norm["tensor"] == LABEL).any()


def test_explorer_shows_the_origins_own_module_shape_and_stack():
    pytest.importorskip("ipywidgets")
    from precnb.widgets import explore

    ex = explore(sample_path("rank_shift"))
    own = _rank_files(1, 1)
    assert (ex.step, ex.rank, ex.tensor, ex.row) == (1, 1, LABEL, "blocks.0.attn")
    status = ex.record.status.value
    assert "module <code>blocks.0.attn</code>" in status and "shape <code>[2, 2, 8, 8]</code>" in status
    assert "names another op on rank 0" in status
    assert ex.record.detail.evidence["stack"] == own["stack"]
    row = ex.record.detail.frame.set_index("tensor").loc[LABEL]
    assert (row["module"], row["shape"]) == (own["module"], own["shape"])
    cell = ex.heatmap_frame()
    first = cell[cell["first_bad"] == 1].iloc[0]
    assert (first["row"], first["tensor"], int(first["worst_rank"])) == ("blocks.0.attn", LABEL, 1)
    caption = ex.record.lines.caption.value  # the chart follows the op itself, under rank 0's own label
    assert "followed on every rank by its module" in caption and "on rank 0 it is Torch.sqrt.1" in caption, caption


def test_report_shows_the_origins_own_module_shape_and_stack():
    pytest.importorskip("jinja2")
    import bs4

    from precnb.report import to_html

    own = _rank_files(1, 1)
    soup = bs4.BeautifulSoup(to_html(sample_path("rank_shift")), "html.parser")
    for w in soup.find_all("wbr"):
        w.decompose()
    soup.smooth()
    text = " ".join(soup.get_text(" ").split())
    assert "blocks.0.attn_norm" not in text.split("names another op")[0]  # not before the note about rank 0
    code = " ".join(own["stack"][0].split("\n")[-1].split())
    assert code in text  # the origin's own source line
    rows = [" ".join(tr.get_text(" ").split()) for tr in soup.find_all("tr")]
    assert any(LABEL in r and "[2, 2, 8, 8]" in r and "blocks.0.attn" in r for r in rows)


def test_pair_views_show_the_targets_own_stack_lines():
    """Two runs whose nodes share names (a port): the explorer's record is the target's, stack included."""
    pytest.importorskip("ipywidgets")
    import glob

    from precnb.widgets import explore

    ex = explore(sample_path("xfw", "ms_bug"), baseline=sample_path("xfw", "pt"))
    ev = ex.record.detail.evidence
    [path] = glob.glob(str(sample_path("xfw", "ms_bug", "step0") / "*" / "stack.json"))
    raw = json.loads(Path(path).read_text())
    own = next(frames for nodes, frames in raw.values() if ev["node"] in nodes)
    assert ev["stack"] == own and "mindspore" in own[0]  # not the PyTorch baseline's frames

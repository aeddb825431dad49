"""The one table of cross-framework dtype equivalences (precnb.dtypes) and every place that compares dtypes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import precnb
from precnb.dtypes import EQUIVALENT, canonical_dtype, dtype_kind, dtype_relation, dtype_size, equivalence


def test_one_spelling_and_the_relations():
    assert canonical_dtype("BFloat16") == canonical_dtype("torch.bfloat16") == "bfloat16"
    assert canonical_dtype("Bool") == canonical_dtype("torch.bool") == "bool"
    assert canonical_dtype("UInt8") == canonical_dtype("torch.uint8") == "uint8"
    assert dtype_relation("torch.bool", "UInt8") == "equivalent"  # a mask
    assert dtype_relation("torch.int64", "Int32") == "equivalent"  # index tensors
    assert dtype_relation("torch.float32", "BFloat16") == "precision"  # values change: the precision rules
    assert dtype_relation("torch.float32", "Int32") == "different"
    assert dtype_relation("torch.bool", "Float32") == "different"
    assert dtype_relation("Float32", "torch.float32") == "same"
    assert dtype_kind("UInt8") == "int" and dtype_kind("Bool") == "bool" and dtype_kind("BFloat16") == "float"
    assert dtype_size("BFloat16") == 2 and dtype_size("Bool") == 1
    assert equivalence("torch.bool", "UInt8") == EQUIVALENT[0][1]


def test_the_old_spellings_all_go_through_the_table():
    from precnb.analysis.compare.precision import normalise_dtype
    from precnb.analysis.compare.tolerance import Tolerance, _dtype_key
    from precnb.analysis.findings.plan import dtype_size as plan_size
    from precnb.analysis.nan.causes import _dtype_key as causes_key
    from precnb.naming import canonical_dtype as naming_canonical

    for d in ("BFloat16", "torch.half", "Float32", "torch.float", "UInt8", "Bool", "numpy.float64", "mindspore.Int64"):
        want = canonical_dtype(d)
        assert naming_canonical(d) == normalise_dtype(d) == _dtype_key(d) == causes_key(d) == want, d
        assert plan_size(d) == dtype_size(d)
    assert Tolerance().rtol_for("torch.half") == Tolerance().rtol_for("Float16") == 2 ** -11
    assert Tolerance().rtol_for("UInt8") == Tolerance().rtol_for("Bool") == 0.0


def _leaf(fw: str, dtype: str, shape: list[int], mx, mn, mean=None, norm=None) -> dict:
    leaf = {"type": "torch.Tensor" if fw == "pytorch" else "mindspore.Tensor", "dtype": dtype, "shape": shape,
            "Max": mx, "Min": mn, "Mean": mean, "Norm": norm}
    if fw == "pytorch":
        leaf["requires_grad"] = False
    return leaf


def _run(root: Path, fw: str, mask: dict, x_max: float = 1.5) -> Path:
    """One attention call: a float input and a boolean mask (torch.bool, or MindSpore's UInt8)."""
    f32 = "torch.float32" if fw == "pytorch" else "Float32"
    data = {"Functional.scaled_dot_product_attention.0.forward": {
        "input_args": [_leaf(fw, f32, [1, 4, 8], x_max, -1.5, 0.01, 3.5)],
        "input_kwargs": {"attn_mask": mask},
        "output": [_leaf(fw, f32, [1, 4, 8], 1.25, -1.25, 0.02, 3.25)]}}
    (root / "step0" / "rank0").mkdir(parents=True)
    (root / "step0" / "rank0" / "dump.json").write_text(json.dumps(
        {"task": "statistics", "level": "L1", "framework": fw, "dump_data_dir": None, "data": data}))
    return root


MASK = "Functional.scaled_dot_product_attention.0.forward.input.attn_mask"


def test_a_bool_mask_stored_as_uint8_is_a_note_never_a_divergence(tmp_path):
    pt = _run(tmp_path / "pt", "pytorch", _leaf("pytorch", "torch.bool", [1, 1, 4, 4], True, False))
    ms = _run(tmp_path / "ms", "mindspore", _leaf("mindspore", "UInt8", [1, 1, 4, 4], 1.0, 0.0, 0.625, 3.16))
    t = precnb.diagnose(ms, baseline=pt, progress=False)
    f = t.result("first_divergence")
    assert f.kind == "none", f.summary()
    assert f.stats["dtype_notes"][MASK] == {"baseline": "torch.bool", "target": "UInt8",
                                            "why": "a bool mask stored as uint8 holds the same 0/1 values"}
    assert any("differ in dtype only" in h and MASK in h for h in f.hints)
    cmp = t.comparison()
    assert not bool(cmp.differs.any()) and MASK not in cmp.dtype_changed
    assert f.dump_plan is None and f.gap is None


def test_a_mask_whose_values_differ_is_found_on_its_values_with_the_dtype_as_a_note(tmp_path):
    pt = _run(tmp_path / "pt", "pytorch", _leaf("pytorch", "torch.bool", [1, 1, 4, 4], True, False))
    ms = _run(tmp_path / "ms", "mindspore", _leaf("mindspore", "UInt8", [1, 1, 4, 4], 1.0, 1.0, 1.0, 4.0))
    f = precnb.diagnose(ms, baseline=pt, progress=False).result("first_divergence")
    assert f.kind == "first_divergence" and f.tensor == MASK  # Min 0 vs 1: a real value difference
    assert f.values["dtype_note"].startswith("torch.bool vs UInt8: a bool mask")
    assert not any("dtype differs at this tensor" in h for h in f.hints)


@pytest.mark.parametrize("dtypes", [("torch.float32", "BFloat16"), ("torch.bool", "Float32")])
def test_a_dtype_change_that_changes_values_stays_a_difference(tmp_path, dtypes):
    """fp32 vs bf16 (one tensor: an isolated change) and bool vs float are dtype differences as before."""
    b_dtype, t_dtype = dtypes
    mask_b = _leaf("pytorch", b_dtype, [1, 1, 4, 4], True if "bool" in b_dtype else 1.0, False if "bool" in b_dtype
                   else 0.0)
    pt = _run(tmp_path / "pt", "pytorch", mask_b)
    ms = _run(tmp_path / "ms", "mindspore", _leaf("mindspore", t_dtype, [1, 1, 4, 4], 1.0, 0.0))
    f = precnb.diagnose(ms, baseline=pt, progress=False).result("first_divergence")
    assert f.kind == "first_divergence" and f.tensor == MASK
    assert MASK not in f.stats.get("dtype_notes", {})

"""Edge-case tensor pairs for checking precnb's metrics against the real ``msprobe compare``.

:func:`write_edge_dumps` writes two msprobe-format tensor-mode rank folders (dump.json +
dump_tensor_data/*.pt, saved with torch) whose tensors hit every special case of msprobe's
tensor compare: matching and mismatching NaN/±inf, 0-d and one-element tensors, squeezable
shapes, empty tensors, shape mismatches, all-zero sides, zeros in the baseline, bf16/fp16/fp64,
ints, bools, a float/int dtype clash, float32 overflow of the relative error, cosine rounding.
Needs torch (only to write the files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _cases(torch: Any) -> list[tuple[str, Any, Any]]:
    t = torch.tensor
    inf, nan = float("inf"), float("nan")
    g = torch.Generator().manual_seed(7)
    r = torch.randn(64, generator=g)
    return [
        ("same_nan_inf", t([1.0, nan, inf, -inf, 2.0, 3.0]), t([1.5, nan, -inf, inf, 2.0, 3.25])),
        ("nan_moved", t([1.0, nan, 2.0, 3.0]), t([1.0, 2.0, nan, 3.0])),
        ("inf_one_side", t([1.0, inf, 2.0]), t([1.0, 5.0, 2.0])),
        ("zero_d", t(1.5), t(1.25)),
        ("zero_d_nan", t(nan), t(1.0)),
        ("zero_d_bool", t(True), t(False)),
        ("zero_d_int", t(7), t(5)),
        ("one_element", t([3.0]), t([2.0])),
        ("one_by_one", t([[0.0]]), t([[0.0]])),
        ("squeezable", r[:4].reshape(1, 4), r[:4] * 1.001),
        ("empty", torch.zeros(0, 3), torch.zeros(0, 3)),
        ("shape_mismatch", r[:6].reshape(2, 3), r[:6].reshape(3, 2)),
        ("all_zero_both", torch.zeros(5), torch.zeros(5)),
        ("all_zero_target", torch.zeros(5), r[:5]),
        ("all_zero_baseline", r[:5], torch.zeros(5)),
        ("baseline_zeros", t([0.0, 1.0, 0.0, 2.0]), t([0.0, 1.0, 1e-3, 0.0])),
        ("bf16_vs_fp32", r.to(torch.bfloat16), r),
        ("fp16_vs_fp16", r.half(), (r * 1.0004).half()),
        ("fp16_vs_fp32", r.half(), r),
        ("fp64", r.double(), r.double() + 1e-9),
        ("int64", torch.arange(10), torch.arange(10) * 2),
        ("bool", t([True, False, True]), t([True, True, True])),
        ("int_vs_float", torch.arange(4), torch.arange(4).float()),
        ("overflow_rel", t([3e38, 1.0]), t([1e-38, 1.0])),
        ("cosine_near_one", r, r + 1e-4 * torch.randn(64, generator=g)),
        ("negated", r, -r),
        ("identical", r, r.clone()),
        ("tiny_diff", r, r + 1e-13),
    ]


def _leaf(torch: Any, x: Any, name: str) -> dict[str, Any]:
    dtype = str(x.dtype)
    stats: dict[str, Any]
    if x.numel() and x.dtype.is_floating_point:
        f = x.float()
        stats = {"Max": f.max().item(), "Min": f.min().item(), "Mean": f.mean().item(),
                 "Norm": f.norm().item()}
    elif x.numel():
        stats = {"Max": x.max().item(), "Min": x.min().item(), "Mean": None, "Norm": None}
    else:
        stats = {"Max": None, "Min": None, "Mean": None, "Norm": None}
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(x.shape), **stats,
            "requires_grad": False, "data_name": name}


def write_edge_dumps(root: Path) -> dict[str, str]:
    """Write ``root/{target,baseline}/step0/rank0``; return {case: compare row name}."""
    import torch

    rows = {}
    sides: dict[str, dict[str, Any]] = {"target": {}, "baseline": {}}
    for i, (case, a, b) in enumerate(_cases(torch)):
        node = f"Functional.edge_{case}.{i}.forward"
        name = f"{node}.output.0.pt"
        for side, x in (("target", a), ("baseline", b)):
            folder = root / side / "step0" / "rank0" / "dump_tensor_data"
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(x.clone(), folder / name)
            sides[side][node] = {"input_args": [], "input_kwargs": {}, "output": [_leaf(torch, x, name)]}
        rows[case] = f"{node}.output.0"
    for side, data in sides.items():
        rank = root / side / "step0" / "rank0"
        doc = {"task": "tensor", "level": "L1", "framework": "pytorch",
               "dump_data_dir": str(rank / "dump_tensor_data"), "data": data}
        (rank / "dump.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
        (rank / "construct.json").write_text("{}", encoding="utf-8")
    return rows

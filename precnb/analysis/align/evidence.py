"""Evidence that two tensors, nodes or modules of two runs are the same thing.

Value evidence compares reference statistics scale-aware (the error relative to the tensor's
magnitude), so a port that computes the same function agrees to float noise while a different
tensor almost never agrees on Max, Min, Mean and Norm at once. Low-information tensors
(constants, booleans, scalars) count for less: equal statistics there prove little.

Examples
--------
>>> close((1.0, -1.0, 0.0, 3.0), (1.0, -1.0, 1e-9, 3.0000001))
True
>>> close((1.0, -1.0, 0.0, 3.0), (1.1, -1.0, 0.0, 3.0))
False
"""

from __future__ import annotations

import math

from precnb.analysis.align.tree import ModuleInfo, NodeInfo, RunTree, TensorInfo
from precnb.dtypes import dtype_kind, same_values

__all__ = ["VALUE_RTOL", "close", "information", "module_values", "node_values", "tensor_score"]

VALUE_RTOL = 2e-3
"""Scale-aware agreement that counts as "the same values" for pairing (bf16 noise passes, a bug does not)."""


def _scale(s: tuple[float, float, float, float]) -> float:
    parts = [abs(x) for x in s[:3] if math.isfinite(x)]
    return max(parts) if parts else 0.0


def close(a: tuple[float, float, float, float], b: tuple[float, float, float, float], rtol: float = VALUE_RTOL
          ) -> bool:
    """Whether two (max, min, mean, norm) tuples agree scale-aware (NaN = NaN, inf = inf; nulls ignored)."""
    ax, an, am, a3 = a
    bx, bn, bm, b3 = b
    if math.isfinite(ax + an + am + a3 + bx + bn + bm + b3):  # the common case, all finite: the same test, inline
        tol = rtol * max(abs(ax), abs(an), abs(am), abs(bx), abs(bn), abs(bm), 1e-30)
        return (abs(ax - bx) <= tol and abs(an - bn) <= tol and abs(am - bm) <= tol
                and abs(a3 - b3) <= rtol * max(abs(a3), abs(b3), 1e-30))
    scale = max(_scale(a), _scale(b), 1e-30)
    seen = False
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if math.isnan(x) and math.isnan(y):
            continue
        if math.isnan(x) or math.isnan(y):
            if k >= 2:  # a null mean / norm (int tensors in one framework only): not evidence either way
                continue
            return False
        seen = True
        if math.isinf(x) or math.isinf(y):
            if x != y:
                return False
            continue
        ref = scale if k < 3 else max(abs(x), abs(y), 1e-30)
        if abs(x - y) > rtol * ref:
            return False
    return seen


def information(t: TensorInfo) -> float:
    """How much equal statistics of *t* prove (0 for nothing recorded, 1 for a varied float tensor)."""
    mx, mn, _mean, _norm = t.stats
    if math.isnan(mx) and math.isnan(mn):
        return 0.0
    if t.numel == 1 or t.shape in ("[]", "()"):
        return 0.25
    if not t.is_float:
        return 0.35
    if mx == mn:
        return 0.2  # a constant tensor
    return 1.0


def _numel_ok(a: TensorInfo, b: TensorInfo) -> bool:
    return a.numel == b.numel or a.numel < 0 or b.numel < 0


def _kind(dtype: str) -> str:
    kind = dtype_kind(dtype)  # the one dtype table (precnb.dtypes)
    return "float" if kind == "complex" else (kind or ("int" if dtype else ""))


def tensor_score(a: TensorInfo, b: TensorInfo, *, same_framework: bool, position: bool) -> float:
    """How likely tensors *a* and *b* (of two paired nodes) are the same tensor.

    Parameters
    ----------
    a, b : TensorInfo
    same_framework : bool
        Slot names (``input.1``) mean the same in both runs.
    position : bool
        They sit at the same position of their node's group.
    """
    s = 0.0
    s += 1.0 if _numel_ok(a, b) else -1.5
    ka, kb = _kind(a.dtype), _kind(b.dtype)
    # a bool mask stored as uint8 is the same tensor (precnb.dtypes.EQUIVALENT); another int / bool pair may be
    s += 0.3 if ka == kb or same_values(a.dtype, b.dtype) else (-0.2 if {ka, kb} == {"int", "bool"} else -0.6)
    if close(a.stats, b.stats):
        s += 2.0 * min(information(a), information(b)) + 0.2
    if same_framework and a.label == b.label:
        s += 2.0  # the same tensor of the same node in one framework (a shard may have another size)
    if a.slot == b.slot:
        s += 0.6 if same_framework else 0.35
    elif position:
        s += 0.2
    if a.slot.rsplit(".", 1)[-1] == b.slot.rsplit(".", 1)[-1] and not a.slot[-1:].isdigit():
        s += 0.3  # the same keyword / parameter name
    return s


def node_values(a: NodeInfo, b: NodeInfo) -> float:
    """Value evidence that two nodes compute the same thing: their first outputs (and inputs) agree."""
    s = 0.0
    oa, ob = a.outputs, b.outputs
    if oa and ob:
        best = 0.0
        for x in oa[:3]:
            for y in ob[:3]:
                if _numel_ok(x, y) and close(x.stats, y.stats):
                    best = max(best, min(information(x), information(y)))
        s += 1.6 * best
    ia, ib = a.inputs, b.inputs
    if ia and ib:
        hits = 0.0
        for x in ia[:4]:
            if any(_numel_ok(x, y) and close(x.stats, y.stats) for y in ib[:6]):
                hits += information(x)
        s += 0.5 * min(hits, 1.0)
    return s


def module_values(tb: RunTree, mb: ModuleInfo, tt: RunTree, mt: ModuleInfo) -> float:
    """Value evidence for a module pair: equal parameters (same weights) and equal first-call outputs."""
    if not mb.forward or not mt.forward:
        return 0.0
    na, nb = tb.nodes.get(mb.forward[0]), tt.nodes.get(mt.forward[0])
    if na is None or nb is None:
        return 0.0
    s = 0.0
    pa, pb = na.group("parameters"), nb.group("parameters")
    if pa and pb:
        hits = sum(1 for x in pa if any(_numel_ok(x, y) and close(x.stats, y.stats, 1e-4) for y in pb))
        if hits:
            s += 2.0 * hits / max(len(pa), len(pb))
    s += node_values(na, nb)
    return s

"""Why a call one codebase makes and the other does not is organisation, not a divergence.

Two codebases of one model (Megatron-Core and Hugging Face) build the same values with different
glue. A node left without a counterpart is set aside (never compared, listed with its reason) when
it produces no compared value, by one of these rules, each decided from the recorded statistics:

* **bookkeeping**: every tensor of the call is an integer or boolean (index or mask construction);
* **mask**: the call builds or applies an attention mask (a boolean tensor, or a float one of 0 where
  kept and a huge negative where masked); the fill value is the codebase's own, the softmax that
  consumes the masked scores is compared;
* **identity**: its output equals its input (dropout with p=0, ``IdentityOp``);
* **recorded elsewhere**: its output's values are recorded in the other run too (a value computed
  once there and in every layer here, or inside a module the other run records at another level);
* **fused step**: an intermediate of a computation the other run makes in one op (``matmul`` then
  ``* scale`` against ``baddbmm(alpha=scale)``): its output feeds a paired call whose partner reads
  the same inputs;
* **unrecorded counterpart**: a call inside a paired module whose counterpart records no call at all
  (a fused kernel msprobe does not hook, or the parts of a fused projection): the module's record is
  compared.

Examples
--------
>>> is_mask_stats("bool", (1.0, 0.0, float("nan"), float("nan")))
True
>>> is_mask_stats("float32", (0.0, -3.4e38, float("-inf"), float("inf")))
True
>>> is_mask_stats("float32", (0.5, -0.5, 0.0, 1.0))
False
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict

from precnb.analysis.align.evidence import VALUE_RTOL, close, information
from precnb.analysis.align.tree import NodeInfo, RunTree, TensorInfo
from precnb.analysis.align.vocab import op_similarity

__all__ = ["ValueIndex", "aside_reason", "call_modules", "in_backward", "is_codebase_aside", "is_mask_stats",
           "same_result", "tensors_disagree"]

#: an additive attention mask keeps 0 and masks with at most this (Megatron -10000, HF finfo.min)
_MASK_FILL = -1e4
#: at most this many unpaired calls on either side of a call make one decomposition of a fused op
_MAX_STEPS = 16


#: how the reasons of :func:`aside_reason` begin (after ``organisation: ``)
_RULES = ("integer / boolean bookkeeping", "attention-mask construction", "an identity call",
          "its value is recorded in the other run", "an intermediate step of", "inside ", "a call made while the "
          "backward pass runs", "the backward of ")


def is_codebase_aside(why: str) -> bool:
    """Whether an alignment reason *why* comes from one of this module's rules."""
    return why.startswith("organisation: ") and why.removeprefix("organisation: ").startswith(_RULES)


def is_mask_stats(dtype: str, stats: tuple[float, float, float, float]) -> bool:
    """Whether a tensor of *dtype* with (max, min, mean, norm) *stats* is an attention mask."""
    if dtype == "bool":
        return True
    mx, mn = stats[0], stats[1]
    return dtype.startswith(("float", "bfloat", "half")) and mx == 0.0 and mn <= _MASK_FILL


class ValueIndex:
    """The float tensors of one run, by element count and norm, to ask whether a value is recorded there.

    Each element count's tensors are sorted by norm: a query looks at those whose norm is within the
    comparison's tolerance of its own (every tensor of a common size, not the first few hundred), and
    answers the first recorded one that is close, as a scan in record order would.
    """

    def __init__(self, tree: RunTree) -> None:
        self.by_numel: dict[int, list[tuple[TensorInfo, str]]] = defaultdict(list)
        for name, info in tree.nodes.items():
            for t in info.tensors:
                if t.is_float and information(t) >= 1.0:
                    self.by_numel[t.numel].append((t, name))
        self._sorted: dict[int, tuple[list[float], list[int]]] = {}
        self._odd: dict[int, list[int]] = {}  # positions of tensors without a finite norm (partial sums)
        for numel, entries in self.by_numel.items():
            finite = sorted((e[0].stats[3], k) for k, e in enumerate(entries) if math.isfinite(e[0].stats[3]))
            self._sorted[numel] = ([n for n, _ in finite], [k for _, k in finite])
            self._odd[numel] = [k for k, e in enumerate(entries) if not math.isfinite(e[0].stats[3])]

    def find(self, t: TensorInfo, *, limit: int = 400) -> str | None:
        """A node of the indexed run that records *t*'s values (same element count, close statistics)."""
        entries = self.by_numel.get(t.numel)
        if not entries:
            return None
        norm = t.stats[3]
        if math.isfinite(norm):
            norms, order = self._sorted[t.numel]
            tol = VALUE_RTOL * abs(norm) / (1.0 - VALUE_RTOL) + 1e-300
            lo, hi = bisect_left(norms, norm - tol), bisect_right(norms, norm + tol)
            cands = order[lo:hi] + self._odd[t.numel][:limit]
        else:
            cands = list(range(min(len(entries), limit)))
        hits = [k for k in cands if close(t.stats, entries[k][0].stats)]
        return entries[min(hits)][1] if hits else None


def same_result(x: NodeInfo, y: NodeInfo) -> bool:
    """Whether two calls produce the same first output from other inputs (neither copies its input).

    A one-element output (a loss) counts when it is not a round number (0, 1, an integer proves little).
    """
    ox, oy = _floats(x.outputs), _floats(y.outputs)
    if not ox or not oy or ox[0].numel != oy[0].numel:
        return False
    a = ox[0]
    if information(a) < 1.0 and not (a.numel == 1 and math.isfinite(a.stats[0]) and a.stats[0] != round(a.stats[0])):
        return False
    return close(a.stats, oy[0].stats) and not _identity(x) and not _identity(y)


def _masked(t: TensorInfo) -> bool:
    return t.is_float and t.stats[1] <= _MASK_FILL


def tensors_disagree(a: TensorInfo, b: TensorInfo, values_a: ValueIndex, values_b: ValueIndex, *,
                     same_list: bool = False) -> bool:
    """Whether *a* (baseline) and *b* (target) must not pair: different values, one found elsewhere.

    Masked scores of both runs never pair (each codebase fills masked positions with its own
    constant), nor elements of list arguments (each codebase's parameter order) unless *same_list*: entries
    under one label in lists renamed to the other run's labels by the parameter each holds
    (:func:`precnb.analysis.layout.optimizer_lists.align_optimizer_lists`), which pair whatever their values
    (an optimizer's gradient scaled after the backward has its unscaled value recorded in the other run, at the
    op that computed it); an input whose value is recorded elsewhere in the other run is that value's
    counterpart, not *b* (HF passes the rotary cos / sin where Megatron passes the angles). Outputs always
    pair: an op's result is what is compared.
    """
    if close(a.stats, b.stats):
        return False
    if a.slot.count(".") >= 2 and b.slot.count(".") >= 2:
        return not same_list  # elements of a list argument (an optimizer's parameters): each codebase's own order
    if _masked(a) and _masked(b):
        return True
    if not (a.is_float and b.is_float and information(a) >= 1.0 and information(b) >= 1.0):
        return False
    if a.group not in ("input", "kwargs") or b.group not in ("input", "kwargs"):
        return False  # an op's own result is compared with its counterpart's, whatever else holds that value
    return values_b.find(a) is not None or values_a.find(b) is not None


def _floats(ts: list[TensorInfo]) -> list[TensorInfo]:
    return [t for t in ts if t.is_float]


def _identity(info: NodeInfo) -> bool:
    ins, outs = _floats(info.inputs), _floats(info.outputs)
    return bool(ins and outs) and any(o.numel == i.numel and close(o.stats, i.stats, 1e-6)
                                      for o in outs[:1] for i in ins)


def _fused_step(info: NodeInfo, tree: RunTree, partner: dict[str, str], other: RunTree) -> str | None:
    """The other run's op that makes in one call what the unpaired calls around *info* make in several.

    The unpaired calls between two paired calls of one scope are a decomposition when the paired call
    that ends them was paired by value with an op of another kind (``baddbmm(alpha)`` against ``matmul``
    then ``* scale``, ``cross_entropy`` against ``max``, ``exp``, ``sum``, ``log``, ``mean``) and that op reads
    what one of them reads.
    """
    calls = tree.calls_in.get(info.parent, [])
    if info.name not in calls:
        return None
    k = calls.index(info.name)
    lo = k
    while lo > 0 and calls[lo - 1] not in partner and k - lo < _MAX_STEPS:
        lo -= 1
    hi = k + 1
    while hi < len(calls) and calls[hi] not in partner and hi - k < _MAX_STEPS:
        hi += 1
    if hi >= len(calls) or calls[hi] not in partner:
        return None
    y, x = tree.nodes.get(calls[hi]), other.nodes.get(partner[calls[hi]])
    if y is None or x is None or op_similarity(x.api, y.api) > 0.0 or not same_result(x, y):
        return None
    reads = [j for j in x.inputs if j.is_float and information(j) >= 1.0]
    for name in calls[lo:hi]:
        step = tree.nodes.get(name)
        if step is not None and any(i.numel == j.numel and close(i.stats, j.stats) for i in step.inputs
                                    for j in reads):
            return x.name
    return None


def aside_reason(info: NodeInfo, tree: RunTree, other: RunTree, *, partner: dict[str, str],
                 modules: dict[str, str], other_values: ValueIndex, other_call_modules: set[str]) -> str | None:
    """Why the unpaired *info* of *tree* is organisation (see the module docstring), or None.

    Parameters
    ----------
    info : NodeInfo
        A node of *tree* with no counterpart in *other*.
    tree, other : RunTree
        Its run and the other run.
    partner : dict
        Paired nodes of *tree* → their counterparts in *other*.
    modules : dict
        Paired module paths of *tree* → their counterparts in *other*.
    other_values : ValueIndex
        The other run's float tensors.
    other_call_modules : set of str
        Module paths of *other* (and their ancestors) inside which it records an API call.
    """
    if info.kind == "api" and info.tensors and not any(t.is_float for t in info.tensors):
        return "organisation: integer / boolean bookkeeping (index or mask construction), no floating-point value"
    if info.kind == "api" and any(is_mask_stats(t.dtype, t.stats) for t in info.tensors if t.group != "parameters"):
        return ("organisation: attention-mask construction or application (masked positions take each "
                "codebase's own fill value; the softmax that consumes the scores is compared)")
    if _identity(info):
        return "organisation: an identity call (its output equals its input: dropout with p=0, IdentityOp)"
    outs = [t for t in _floats(info.outputs) if information(t) >= 1.0]
    if outs:
        where = other_values.find(outs[0])
        if where is not None:
            return f"organisation: its value is recorded in the other run too ({where}), computed at another place"
    if info.kind == "api" and info.direction != "backward" and in_backward(info, tree):
        return ("organisation: a call made while the backward pass runs (a custom autograd backward; the other "
                "run's autograd computes it without recorded calls), its gradients are compared")
    if info.kind == "api" and info.parent in tree.glue:
        return f"organisation: inside {info.parent}, {tree.glue[info.parent]}"
    if info.kind == "api":
        whole = _fused_step(info, tree, partner, other)
        if whole is not None:
            return f"organisation: an intermediate step of {whole}, which the other run makes in one op"
        counterpart = modules.get(info.module)
        if counterpart is not None and counterpart not in other_call_modules:
            return (f"organisation: inside {info.module or 'the root'}, whose counterpart {counterpart} records no "
                    "call (a fused kernel or projection): the module's record is compared")
    return None


def in_backward(info: NodeInfo, tree: RunTree) -> bool:
    """Whether a forward-direction call runs inside a backward pass.

    Its parent is a backward module call, or the last record before it that is not a forward API
    call is a backward record (no forward module call completed in between).
    """
    if ".backward." in info.parent:
        return True
    order = _order(tree)
    k = order["pos"].get(info.name)
    if k is None:
        return False
    prev = order["marks"][k]
    return prev is not None and tree.nodes[prev].direction == "backward"


def _order(tree: RunTree) -> dict[str, dict]:
    """Per node, the last earlier record that is a module call or a backward call (cached on the tree)."""
    cached = getattr(tree, "_aside_order", None)
    if cached is not None:
        return cached
    names = sorted(tree.nodes, key=lambda n: (tree.nodes[n].seq, n))
    pos: dict[str, int] = {}
    marks: dict[int, str | None] = {}
    last: str | None = None
    for k, n in enumerate(names):
        info = tree.nodes[n]
        pos[n] = k
        marks[k] = last
        if info.kind == "module" or info.direction == "backward":
            last = n
    cached = {"pos": pos, "marks": marks}
    tree._aside_order = cached  # type: ignore[attr-defined]
    return cached


def call_modules(tree: RunTree) -> set[str]:
    """Module paths (and every ancestor) inside which *tree* records an API call."""
    out: set[str] = set()
    for info in tree.nodes.values():
        if info.kind == "api" and info.module:
            parts = info.module.split(".")
            out.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return out

"""Why a call of either run is left unpaired: not captured, organisation, glue, or unpaired (with its reason).

The last step of :func:`precnb.analysis.align.pairing.pair_runs`: every call the pairing left on one side gets
the reason the alignment report (``Alignment.left``) and the comparison show.
"""

from __future__ import annotations

from typing import Any

from precnb.analysis.align._state import AlignerState
from precnb.analysis.align.aside import ValueIndex, aside_reason, call_modules
from precnb.analysis.align.evidence import close
from precnb.analysis.align.tree import ROOT, SCOPES, NodeInfo, RunTree
from precnb.analysis.align.vocab import is_glue_op, op_similarity
from precnb.naming import is_communication, op_key

__all__ = ["classify"]

_P2P = frozenset({"send", "recv", "isend", "irecv", "batchisendirecv", "p2pop"})
_FINISHING_OPS = ("div_", "mul_", "__itruediv__", "__imul__", "div", "mul", "__truediv__", "__mul__")



def _aside(self: AlignerState, info: NodeInfo) -> str | None:
    a = self._aside_args
    if a is None:
        return None
    return aside_reason(info, a.tree, a.other, partner=a.partner, modules=a.modules, other_values=a.values,
                        other_call_modules=a.call_modules)

def _backward_aside(self: AlignerState, info: NodeInfo, side: str, paired: dict[str, Any]) -> str | None:
    """Two codebases: why the backward of an API call is organisation (its forward's pair or reason)."""
    if self.same_names or info.kind != "api" or not info.name.endswith(".backward"):
        return None
    fwd = info.name[: -len("backward")] + "forward"
    why = self.out.left[side].get(fwd, "")
    if why.startswith(("organisation", "glue")):
        return f"organisation: the backward of {fwd}, set aside ({why.split(': ', 1)[-1]})"
    partner = paired.get(fwd)
    if partner is not None:
        other_name = partner[0] if isinstance(partner, tuple) else partner
        other = (self.tt if side == "baseline" else self.tb).nodes.get(other_name)
        if other is not None and op_similarity(info.api, other.api) == 0.0:
            return (f"organisation: the backward of {fwd}, paired by value with {other_name}, another op of the "
                    "other run's decomposition (their gradients are of other inputs)")
    return None

def classify(self: AlignerState) -> None:
    """Why each unpaired call of either run is left: not captured, organisation, glue, or unpaired."""
    for side, tree, paired, other in (("baseline", self.tb, self.out.nodes, self.tt),
                                      ("target", self.tt, self.node_rev, self.tb)):
        if not self.same_names:
            self._aside_args = _AsideArgs(tree, other, paired, self.out.modules if side == "baseline"
                                          else self.mod_rev)
        other_scopes = {i.parent for i in other.nodes.values()}
        other_backward = any(i.direction == "backward" for i in other.nodes.values())
        wrappers = self.wrappers[side]
        mods = self.out.modules if side == "baseline" else self.mod_rev
        # forward calls first: the backward of a call set aside is set aside with it
        for n, info in sorted(tree.nodes.items(), key=lambda kv: kv[1].direction == "backward"):
            if n in paired:
                continue
            if not info.tensors:
                continue  # known from construct.json only: nothing to compare
            why = _backward_aside(self, info, side, paired) or _why(self,
                info, tree, mods, wrappers, other_scopes, other_backward, paired, other.parallel)
            self.out.left[side][n] = why
    self._aside_args = None

def _why(self: AlignerState, info: NodeInfo, tree: RunTree, mods: dict[str, Any], wrappers: set[str],
         other_scopes: set[str], other_backward: bool, paired: dict[str, Any], other_parallel: str) -> str:
    if info.direction == "backward" and not other_backward:
        return "not captured: the other run recorded no backward pass"
    scope = info.parent if info.parent in SCOPES else ""
    if scope and scope not in other_scopes:
        return f"not captured: the other run recorded no {scope} calls"
    if info.kind != "api" and info.name in tree.glue:  # e.g. a part of a fused projection
        return f"organisation: {tree.glue[info.name]}"
    if info.kind == "module":
        if info.module in wrappers:
            return "organisation: a wrapper module the other run does not have"
        if info.module not in mods:
            inside = [m for m in mods if m.startswith(info.module + ".")]
            if inside:
                return "organisation: a module level the other run does not have (its contents paired)"
        return _aside(self, info) or "unpaired: a module call with no counterpart"
    if info.kind == "param_grad":
        return "unpaired: a parameter gradient with no counterpart"
    if is_glue_op(info.api):
        return f"glue: {op_key(info.api)} only moves, reshapes or casts data"
    if info.name in tree.glue:
        return f"organisation: {tree.glue[info.name]}"
    if tree.parallel and not other_parallel and _after_collective(info, tree):
        return ("organisation: it finishes a collective of this run's parallel layout (e.g. averages a "
                "data-parallel gradient all-reduce)")
    key = op_key(info.api).rstrip("_")
    if key in _P2P:
        return "organisation: point-to-point communication (between pipeline stages)"
    if is_communication(info.name) and tree.parallel and not other_parallel:
        return f"organisation: a collective of this run's parallel layout ({tree.parallel})"
    if info.parent == "optimizer" and any(
            op_key(tree.nodes[n].api) == op_key(info.api) for n in paired if n in tree.nodes
            and tree.nodes[n].parent == "optimizer"):
        return "organisation: one more call of an optimizer op the other run makes once (e.g. per stage)"
    ins, outs = info.inputs, info.outputs
    if ins and outs and ins[0].numel == outs[0].numel and close(ins[0].stats, outs[0].stats, 1e-6):
        return "glue: its output equals its input (a copy or a layout change)"
    aside = _aside(self, info)
    if aside:
        return aside
    if info.direction == "backward":
        return "unpaired: the backward of an unpaired call"
    return "unpaired: an op with no counterpart"


class _AsideArgs:
    """What :func:`precnb.analysis.align.aside.aside_reason` needs about one side, built once."""

    def __init__(self, tree: RunTree, other: RunTree, paired: dict[str, Any], modules: dict[str, Any]) -> None:
        self.tree, self.other = tree, other
        self.partner = {k: (v[0] if isinstance(v, tuple) else v) for k, v in paired.items()}
        self.modules = {k: (v[0] if isinstance(v, tuple) else v) for k, v in modules.items()}
        self.values = ValueIndex(other)
        self.call_modules = call_modules(other)


def _after_collective(info: NodeInfo, tree: RunTree) -> bool:
    """An in-place scaling whose input is the output of the collective called just before it in its scope."""
    if info.kind != "api" or op_key(info.api).rsplit(".", 1)[-1] not in _FINISHING_OPS or not info.inputs:
        return False
    calls = tree.calls_in.get(info.parent or ROOT, [])
    k = calls.index(info.name) if info.name in calls else -1
    if k <= 0:
        return False
    prev = tree.nodes[calls[k - 1]]
    first = info.inputs[0]
    return is_communication(prev.name) and any(o.numel == first.numel and close(o.stats, first.stats, 0)
                                               for o in prev.outputs)

"""The finding when the only difference is a call made in one run only, which shifted its API's later labels.

A call made on one rank at one step only (inside the same module call as its neighbours) renumbers every later
call of its API there; the comparison pairs those calls by value at that step and rank
(:mod:`precnb.analysis.compare.shifts`), so what is left is the call itself, recorded in one run only. An op
recorded in one run only is otherwise a note beside "no value divergence" (a layout's glue, a scope one run did
not record): this one ran among calls both runs made, in the same module call, so it is what the runs did
differently, and what a comparison by label (msprobe's own included) would have reported as a value difference
of a neighbour. When a value difference is left as well, the search reports it (and the call, when it ran before
it at its step and rank: :mod:`precnb.analysis.divergence.origin`).
"""

from __future__ import annotations

from typing import Any

from precnb.analysis.divergence.judged import MAX_LISTED, Judged
from precnb.analysis.divergence.origin import _with_baseline_names
from precnb.analysis.findings import Finding
from precnb.analysis.findings.evidence import entry_values, node_evidence

__all__ = ["shifted_call_finding"]


def shifted_call_finding(j: Judged) -> Finding | None:
    """The ``first_divergence`` finding naming the first call made in one run only that shifted labels, or None.

    Parameters
    ----------
    j : Judged
        A judged pair with no value difference left.

    Returns
    -------
    Finding or None
        None when the comparison paired no shifted call (:attr:`Comparison.shifted_calls` empty).
    """
    cmp = j.cmp
    if not cmp.shifted_calls:
        return None
    x: dict[str, Any] = cmp.shifted_calls[0]  # in step, execution order, rank
    names = j.names
    only_in, missing = names[x["only_in"]], names[1 - x["only_in"]]
    own = cmp.base if x["only_in"] == 0 else cmp.targ
    tensor, api, n = str(x["tensor"]), x["api"], int(x["renumbered"])
    module = str(cmp.ds["module"].sel(tensor=tensor).values) if "module" in cmp.ds.coords else ""
    later = (f"the {n} later call(s) of {api} there carry other labels in {only_in} than in {missing} and were "
             f"paired by their values" if n else f"no later call of {api} there")
    reason = (f"{x['node']} runs in {only_in} but not in {missing} (step {x['step']}, rank {x['rank']}), among calls "
              f"both runs made: {later}; no value differs beyond tolerance")
    evidence: dict[str, Any] = {"shifted_calls": cmp.shifted_calls[:MAX_LISTED], "only_in": only_in}
    evidence.update(node_evidence(own, x["node"], step=x["step"], rank=x["rank"]))
    suspects = [{"step": x["step"], "rank": x["rank"], "node": x["node"], "tensor": tensor,
                 "why": f"only in {only_in}"}]
    hint = (f"{x['node']} ran in {only_in} only, on rank {x['rank']} at step {x['step']}: a call count that depends "
            f"on the data or the rank (a branch, a token count); the later {api} labels there name other calls "
            f"than in {missing} (msprobe's compare by label pairs them with their neighbours)")
    f = Finding(kind="first_divergence", reason=reason, step=x["step"], rank=x["rank"], node=x["node"],
                tensor=tensor, module=module or None,
                values={only_in: entry_values(own, step=x["step"], rank=x["rank"], tensor=tensor) if x["only_in"]
                        else {"present": True, **x.get("values", {})}},  # (the baseline's entry may be moved over)
                structural=j.struct_out, crc_only=j.crc_only, hints=[hint, *j.hints], suspects=suspects,
                evidence=evidence, stats=j.stats)
    if x["only_in"] == 0:  # a call only the baseline made: its name is the baseline's
        f.baseline = {"node": x["node"], "tensor": tensor, "module": module or None}
        return f
    return _with_baseline_names(f, j.alignment if j.aligned else None)

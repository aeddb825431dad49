"""Pre-flight check "frozen": the parameters each run freezes, compared between the runs.

Signs of a frozen parameter: no gradient record, ``requires_grad`` false, weights that never change. Part of
:func:`precnb.analysis.preflight.preflight`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.analysis.preflight._common import Param, check, names_list, optimizer_tensors, param_stats, same_stats

__all__ = ["check_frozen"]


def _motion(ds: xr.Dataset, params: dict[str, Param]) -> dict[str, str]:
    """Per parameter: ``changed`` / ``unchanged`` over the run's steps (same rank), ``unknown`` (one step)."""
    out: dict[str, str] = {}
    for name, p in params.items():
        if p.label is None:
            out[name] = "unknown"
            continue
        arr = param_stats(ds, p.label)  # (step, rank, 4)
        verdict = "unknown"
        for r in range(arr.shape[1]):
            rows = [arr[s, r] for s in range(arr.shape[0]) if not np.isnan(arr[s, r]).all()]
            if len(rows) < 2:
                continue
            if any(not same_stats(rows[0], x) for x in rows[1:]):
                verdict = "changed"
                break
            verdict = "unchanged"
        out[name] = verdict
    return out


def _returned(ds: xr.Dataset) -> set[str]:
    """Labels of the parameters a module of *ds* returns as an output (Megatron's skip_bias_add bias)."""
    from precnb.analysis.undefined import returned_parameters

    if ds.attrs.get("returned_parameters"):  # a baseline renamed into the target's names said them first
        return set(json.loads(ds.attrs["returned_parameters"]))
    return {f"{node}.parameters.{n}" for node, names in returned_parameters(ds).items() for n in names}


_SIGNALS = DatasetMemo(size=4)


def _frozen_signals(ds: xr.Dataset, params: dict[str, Param], *, also_returned: frozenset[str] | set[str] = frozenset()
                    ) -> dict[str, list[str]]:
    """Per parameter, the signs that it is frozen in *ds* (``no gradient record``, ...).

    *also_returned*: parameters the other run returns (in the same names): a baseline renamed into the
    target's names has no gradient record where the target records none to pair it with. Reused while the
    same dataset comes with the same parameters (a rerun on the same target: an explorer's Match / Unmatch).
    """
    key = ("frozen_signals", tuple(sorted(also_returned)),
           tuple((n, p.label, p.grad, p.requires_grad) for n, p in params.items()))
    return _SIGNALS.get([ds], key, lambda: _signals(ds, params, also_returned),
                        copy=lambda d: {k: list(v) for k, v in d.items()}, holds=False)


def _signals(ds: xr.Dataset, params: dict[str, Param], also_returned: frozenset[str] | set[str]
             ) -> dict[str, list[str]]:
    has_grads = any(p.grad for p in params.values())
    motion = _motion(ds, params)
    trains = any(v == "changed" for v in motion.values())
    returned = _returned(ds) | set(also_returned)
    out: dict[str, list[str]] = {}
    for name, p in params.items():
        signs = []
        # msprobe writes a module's parameter gradients when its backward hook fires: a bias added outside the
        # module (Megatron's skip_bias_add) can get its gradient later and go unrecorded. A missing record is a
        # sign only for a parameter that is not known to require a gradient and whose weights do not change
        if (has_grads and p.grad is None and p.requires_grad is not True and motion[name] != "changed"
                and p.label not in returned):  # a returned bias's gradient is recorded outside the module
            signs.append("no gradient record")
        if p.requires_grad is False:
            signs.append("requires_grad false")
        if trains and motion[name] == "unchanged":
            signs.append("weights never change")
        out[name] = signs
    return out


def _steps_text(ds: xr.Dataset) -> str:
    from precnb.analysis.summary import format_ranges

    return format_ranges(ds["step"].values.tolist())


def check_frozen(base: xr.Dataset | None, target: xr.Dataset, pb: dict[str, Param] | None, pt: dict[str, Param],
                 names: tuple[str, str]) -> dict[str, Any]:
    """Frozen parameters: no gradient record, ``requires_grad`` false, or weights that never change."""
    title = "Frozen parameters"
    bn, tn = names
    if not pt:
        ob = optimizer_tensors(base) if base is not None else None
        ot = optimizer_tensors(target)
        if ob is not None and ot is not None and len(ob[1]) != len(ot[1]):
            return check("frozen", title, "warn", f"no parameter records; the optimizer updates {len(ob[1])} tensors "
                         f"in the {bn} and {len(ot[1])} in the {tn} ({ot[0]}): parameters frozen, added or left out "
                         "of the optimizer", confidence="low", basis="read")
        return check("frozen", title, "skip", "no parameter records")
    st = _frozen_signals(target, pt)
    if base is None or pb is None:
        frozen = {n: s for n, s in st.items() if s}
        grad_no_motion = [n for n, s in st.items() if s == ["weights never change"] and pt[n].grad]
        if grad_no_motion:
            return check("frozen", title, "warn", f"{names_list(grad_no_motion)}: a gradient is recorded but the "
                         f"weights never change over steps {_steps_text(target)} (not in the optimizer?)",
                         confidence="medium", basis="inferred", frozen={n: s for n, s in frozen.items()})
        text = (f"frozen in {tn}: " + names_list([f"{n} ({', '.join(s)})" for n, s in frozen.items()])
                if frozen else f"no frozen parameter among {len(pt)} in {tn}")
        return check("frozen", title, "pass", text, basis="read", frozen=frozen)
    sb = _frozen_signals(base, pb, also_returned=_returned(target))
    ob, ot = optimizer_tensors(base), optimizer_tensors(target)
    from precnb.analysis.align.fused import fused_parts

    # an optimizer list counts fused projections' parts one by one: not comparable across fused and separate
    fused = bool(fused_parts(base) or fused_parts(target))
    if ob is not None and ot is not None and len(ob[1]) != len(ot[1]) and len(pb) == len(pt) and not fused:
        opt_note = (f"; the optimizer updates {len(ob[1])} tensors in the {bn} and {len(ot[1])} in the {tn} "
                    f"({ot[0]})")
    else:
        opt_note = ""
    common = [n for n in pb if n in pt]
    only_t = {n: st[n] for n in common if st[n] and not sb[n]}
    only_b = {n: sb[n] for n in common if sb[n] and not st[n]}
    both = [n for n in common if st[n] and sb[n]]
    details: dict[str, Any] = {"frozen_in_target_only": only_t, "frozen_in_baseline_only": only_b,
                               "frozen_in_both": both}
    parts = []
    for run, other, found in ((tn, bn, only_t), (bn, tn, only_b)):
        if found:
            parts.append(f"frozen in the {run} only: " + names_list(
                [f"{n} ({', '.join(s)})" for n, s in found.items()]) + f"; the {other} trains "
                + ("it" if len(found) == 1 else "them"))
    if parts:
        strong = any(len(s) > 1 or s[0] != "weights never change" for s in (*only_t.values(), *only_b.values()))
        return check("frozen", title, "fail", "; ".join(parts) + f" (steps {_steps_text(target)})" + opt_note,
                     confidence="high" if strong else "medium", basis="read", **details)
    if opt_note:
        return check("frozen", title, "fail", f"the same parameters but{opt_note.lstrip(';')}: a parameter frozen or "
                     "left out of the optimizer", confidence="medium", basis="read", **details)
    if not common:
        return check("frozen", title, "skip", "no parameter name in common", **details)
    text = f"the same {len(common) - len(both)} of {len(common)} parameters train in both runs"
    if both:
        text += f"; frozen in both: {names_list(both)}"
    return check("frozen", title, "pass", text, basis="read", **details)

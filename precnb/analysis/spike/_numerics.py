"""The *numerics* cause of a loss spike: an overflow, a value near its dtype's largest, an underflow, a loss scale.

An infinity that is there **by design** is never an overflow. The rule is the NaN-origin search's
(:func:`precnb.analysis.events.event_mask`), with an infinite *element* (Max or Min at ±inf;
an infinite Norm alone is not one, msprobe takes a float16 tensor's Norm in float16):

* the output of a masking op (:data:`~precnb.analysis.events.MASKING_APIS`: ``masked_fill``,
  ``where``, ``fill_``, ``triu``, ... — a causal mask written ``masked_fill(mask, -inf)``);
* the same infinity flowing on unchanged (the next op's input with the statistics of a by-design
  one: the softmax that reads the mask), and an output of a node whose inputs carry them;
* a record infinite at every dumped step and rank where it is recorded (at least twice): it was
  there before the loss departed too, so it cannot be what made it depart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precnb.analysis.spike._common import (
    _LOW,
    ORDINARY,
    _cand,
    _others,
    _ratio,
    _seq,
)
from precnb.analysis.spike._hardware import _grad_departures, _uniform_scales
from precnb.analysis.spike._records import View


def _low_max(dtype: str) -> float | None:
    d = dtype.lower().replace("torch.", "").replace("mindspore.", "")
    return _LOW.get(d)


def _numerics_masks(v: View, si: int, t: int, spike_step: int, loss_j: int | None, inf_el: np.ndarray,
                    tops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, tensor) masks at step position *si*: a new overflow, a saturating value, an underflow to zero.

    Only records that precede the loss at the spike step are judged (a monitor's forward
    activations there); an overflow is new when no earlier step holds one in that record.
    """
    mx, mn, nm = v.stats["max"], v.stats["min"], v.stats.get("norm")
    n_ranks = len(v.ranks)
    earlier = inf_el[:si].any(axis=0) if si else np.zeros(inf_el.shape[1:], bool)
    limit = np.full(n_ranks, math.inf)
    if spike_step == t:
        if loss_j is not None:
            ls = v.seq[si, :, loss_j]
            limit = np.where(ls >= 0, ls.astype(float), -math.inf if v.monitor else math.inf)
        elif v.monitor:
            limit = np.full(n_ranks, -math.inf)  # a monitor's step: only its forward activations precede the loss
    fwd_only = v.monitor and spike_step == t
    ok = v.present[si] & ((v.seq[si] < limit[:, None]) | (fwd_only & (v.api == "actv"))[None, :])
    new = inf_el[si] & ~earlier & ok
    with np.errstate(invalid="ignore"):
        peaks = np.fmax(np.abs(mx[si]), np.abs(mn[si]))
        near = ok & ~inf_el[si] & np.isfinite(peaks) & (peaks >= tops / 2)
    zero = np.zeros_like(ok)
    if nm is not None:
        hist = np.delete(nm, si, axis=0)
        histmin = np.delete(mn, si, axis=0)
        fin = np.isfinite(hist)
        nonzero_hist = (fin.sum(axis=0) >= 2) & np.all(np.where(fin, hist > 0, True), axis=0)
        fin_min = np.isfinite(histmin)
        pos_hist = (fin_min.sum(axis=0) >= 2) & np.all(np.where(fin_min, histmin > 0, True), axis=0)
        zero = ok & (((nm[si] == 0) & nonzero_hist) | ((mn[si] == 0) & pos_hist)) & ~inf_el[si]
    return new, near, zero


def _by_design(v: View, inf_el: np.ndarray) -> np.ndarray:
    """(step, rank, tensor): infinite elements there by design (see the module docstring); memoised on the view."""
    got = v.memo.get("by_design_inf")
    if got is None:
        from precnb.analysis.events import event_mask, persistent_nonfinite

        every = persistent_nonfinite(v.present.sum(axis=(0, 1)), (inf_el & v.present).sum(axis=(0, 1)))
        _, benign = event_mask(v.ds, persistent=every)
        got = np.asarray(benign.values, bool)
        v.memo["by_design_inf"] = got
    return got


def numerics_causes(views: list[View], steps: list[int], spike_step: int, loss_label: str | None
                    ) -> list[dict[str, Any]]:
    """Numerics: a new overflow, a saturating float16/bfloat16 value, an underflow to zero, a loss-scale change."""
    out: list[dict[str, Any]] = []
    for v in views:
        mx, mn, nm = v.stats.get("max"), v.stats.get("min"), v.stats.get("norm")
        if mx is None or mn is None:
            continue
        inf_el = np.isinf(mx) | np.isinf(mn)
        if inf_el.any():
            inf_el &= ~_by_design(v, inf_el)  # a causal mask's -inf is not an overflow (issue 47)
        tops = np.asarray([_low_max(d) or np.nan for d in v.dtype], dtype=float)  # float16 / bfloat16 largest
        loss_j = v.index.get(loss_label) if loss_label else None
        for t in steps:
            si = v.step_index(t)
            if si is None:
                continue
            new_m, near_m, zero_m = _numerics_masks(v, si, t, spike_step, loss_j, inf_el, tops)
            for ri in np.flatnonzero(new_m.any(axis=1) | near_m.any(axis=1) | zero_m.any(axis=1)):
                r = v.ranks[ri]
                for j in np.flatnonzero(new_m[ri]):
                    rec = v.record(int(j))
                    val = mx[si, ri, j] if np.isinf(mx[si, ri, j]) else mn[si, ri, j]
                    dt = v.dtype[j].replace("torch.", "")
                    text = (f"overflow at step {t}: {rec['tensor']} holds {'+' if val > 0 else '-'}inf ({dt}"
                            + (f", largest finite {_low_max(v.dtype[j]):.6g}" if _low_max(v.dtype[j]) else "")
                            + ") where earlier steps are finite")
                    out.append(_cand("numerics", True, text, t, r, rec, 3.0, [f"{v.name} {rec['tensor']} Max/Min"],
                                     [(v, t, r, rec["tensor"])], seq=float(v.seq[si, ri, j]), kind="overflow"))
                peaks = np.fmax(np.abs(mx[si, ri]), np.abs(mn[si, ri]))
                for j in np.flatnonzero(near_m[ri]):
                    top, peak = float(tops[j]), float(peaks[j])
                    rec = v.record(int(j))
                    out.append(_cand("numerics", False, f"{rec['tensor']} reaches {peak:.6g} at step {t}, within "
                                     f"2x of {v.dtype[j].replace('torch.', '')}'s largest value {top:.6g} "
                                     "(saturating)", t, r, rec, 1.0, [f"{v.name} {rec['tensor']} Max/Min"],
                                     [(v, t, r, rec["tensor"])], seq=float(v.seq[si, ri, j]), kind="saturation"))
                for j in np.flatnonzero(zero_m[ri]):
                    rec = v.record(int(j))
                    out.append(_cand("numerics", False, f"underflow to zero at step {t}: {rec['tensor']} "
                                     f"{'is all zero' if nm is not None and nm[si, ri, j] == 0 else 'reaches 0'} "
                                     "where every other step is non-zero", t, int(r), rec, 0.8,
                                     [f"{v.name} {rec['tensor']} Min/Norm"], [(v, t, r, rec["tensor"])],
                                     seq=float(v.seq[si, ri, j]), kind="underflow"))
            out += _loss_scale(v, t)
    return _earliest_numerics(out)


def _loss_scale(v: View, t: int) -> list[dict[str, Any]]:
    deps = _grad_departures(v, t)
    scaled = _uniform_scales(v, t)
    out = []
    for ri, r in enumerate(v.ranks):
        k = scaled.get(ri)
        if k is None:
            continue
        first = min((d for d in deps if d[1] == ri), key=lambda d: _seq(v, d[0].pre, t, ri))
        j0 = first[0].pre
        incoming = _first_backward(v, t, ri, k)  # the loss's gradient as it enters the model, when recorded
        if incoming is not None:
            j0 = incoming
        rec = v.record(j0)
        out.append(_cand("numerics", False, f"every gradient of rank {r} is {k:.3g}x the other ranks' at step {t} "
                         "while its forward is ordinary: a loss-scale change (the loss scaled before backward and not "
                         "unscaled, or a scaler out of step on this rank)", t, r, rec, math.log10(max(k, 1 / k)),
                         [f"{v.name} gradients before the reduce, rank {r} against the others"],
                         [(v, t, r, v.labels[j0]), *((v, t, r, v.labels[d[0].pre]) for d in deps if d[1] == ri)],
                         seq=_seq(v, j0, t, ri),
                         kind="loss_scale", scale=k))
    return out


def _first_backward(v: View, step: int, ri: int, scale: float) -> int | None:
    """The first backward activation gradient at (step, rank) when it departs from the other ranks by *scale*."""
    si = v.step_index(step)
    if si is None or len(v.ranks) < 2:
        return None
    grads = (v.kind == "param_grad") | (v.api == "grad_unreduced") | (v.api == "grad_reduced")
    cols = [j for j in np.flatnonzero((v.direction == "backward") & ~grads)
            if v.present[si, ri, j] and v.seq[si, ri, j] >= 0]
    if not cols:
        return None
    j = min(cols, key=lambda c: v.seq[si, ri, c])
    q = _ratio(float(v.at(int(j), step)[ri]), float(_others(v, int(j), step)[ri]))
    return int(j) if np.isfinite(q) and abs(math.log(q) - math.log(scale)) <= math.log(ORDINARY) else None


def _earliest_numerics(cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The earliest numerics event per kind; an event on every rank at the same place is rank None."""
    out = []
    for kind in ("overflow", "loss_scale", "saturation", "underflow"):
        mine = [c for c in cands if c.get("kind") == kind]
        if not mine:
            continue
        first = min(mine, key=lambda c: (c["step"], c["records"][0][0].monitor, c["seq"], c["rank"]))
        same = {c["rank"] for c in mine if c["step"] == first["step"] and c["tensor"] == first["tensor"]}
        ranks = set(first["records"][0][0].ranks)
        if kind != "loss_scale" and len(ranks) > 1 and same >= ranks:
            first = {**first, "rank": None,
                     "records": [(first["records"][0][0], first["step"], r, first["tensor"]) for r in sorted(ranks)]}
        out.append(first)
    return out

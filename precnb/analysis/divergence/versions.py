"""Differences between two runs that are how their msprobe releases record, not what the runs computed.

The readers put the releases a dump can come from into ``attrs["msprobe_release_evidence"]``
(:mod:`precnb.io.msprobe.release`). Some releases record values differently:

- **in-place ops' inputs after the op ran**: releases up to 1.1.1 record every in-place op's input
  (``Tensor.add_``, ``Tensor.lerp_``, ...) after the op changed it, 8.1.0–8.1.2 a 0-d one's (AdamW's
  ``step_t += 1``: ``Tensor.__iadd__.0.forward.input.0`` reads 1.0, the value after the increment).
  :func:`late_inplace_inputs` finds those entries: an in-place op's ``input.0`` that differs between the
  runs while its ``output.0`` agrees, and that equals its own output in a run such a release may have
  written (and does not in the other run). They are a version difference, never a divergence.

Integer statistics null from 26.1.0 (a float before) need nothing here: a statistic null on either side is
not compared (:func:`precnb.analysis.compare.tolerance.relative_difference`).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._arrays import on_grid
from precnb.naming import parse_node

__all__ = ["LATE_INPLACE_RELEASES", "NO_PARAMETER_RELEASES", "counters_continue", "late_inplace_inputs",
           "late_inplace_text", "releases_of", "version_structural_hints"]

#: releases that record an in-place op's input after the op ran (all in-place ops up to 1.1.1; 0-d ones in 8.1.x)
LATE_INPLACE_RELEASES = frozenset({"1.0.1", "1.0.3", "1.0.4", "1.1.0", "1.1.1", "8.1.0", "8.1.1", "8.1.2"})
_STATS = ("max", "min", "mean", "norm")


def releases_of(ds: xr.Dataset) -> list[str] | None:
    """The msprobe releases *ds* may come from (None when the reader said nothing: not an msprobe dump).

    Examples
    --------
    >>> from precnb.schema import empty_dataset
    >>> ds = empty_dataset()
    >>> releases_of(ds) is None
    True
    >>> ds.attrs["msprobe_release_evidence"] = '{"candidates": ["8.1.0", "8.1.1"], "evidence": []}'
    >>> releases_of(ds)
    ['8.1.0', '8.1.1']
    """
    raw = ds.attrs.get("msprobe_release_evidence")
    if not raw:
        return None
    try:
        got = json.loads(raw) if isinstance(raw, str) else raw
        return [str(r) for r in got.get("candidates", [])]
    except (ValueError, AttributeError):
        return None


def _in_place(api: str) -> bool:
    short = api.rsplit(".", 1)[-1]
    return (short.endswith("_") and not short.endswith("__")) or (short.startswith("__i") and short.endswith("__"))


def _equal(ds: xr.Dataset, run: int, a: int, b: int) -> np.ndarray:
    """(step, rank): tensors *a* and *b* of *run* recorded with the same four statistics (NaN equal to NaN)."""
    same = np.asarray(ds["present"].values[run, :, :, a] & ds["present"].values[run, :, :, b], bool)
    for s in _STATS:
        x, y = ds[s].values[run, :, :, a], ds[s].values[run, :, :, b]
        same &= (x == y) | (np.isnan(x) & np.isnan(y))
    return same & (ds["null_stats"].values[run, :, :, a] == ds["null_stats"].values[run, :, :, b])


def late_inplace_inputs(cmp: Any, diff: xr.DataArray, *, releases: tuple[list[str] | None, list[str] | None]
                        ) -> tuple[xr.DataArray, list[dict[str, Any]]]:
    """Entries of *diff* that are an in-place op's input recorded after the op ran, by one run's release.

    Parameters
    ----------
    cmp : Comparison
    diff : xarray.DataArray
        (step, rank, tensor) differences the search counts.
    releases : (list or None, list or None)
        :func:`releases_of` the baseline and the target (None: unknown, any release).

    Returns
    -------
    mask : xarray.DataArray
        (step, rank, tensor) bool, within *diff*.
    examples : list of dict
        One per tensor: ``tensor``, ``run`` (the side whose release records late), ``releases``, ``step``,
        ``rank`` and the count of entries.
    """
    ds = cmp.ds
    mask = np.zeros(diff.shape, bool)
    examples: list[dict[str, Any]] = []
    late_sides = [side for side in (0, 1)
                  if releases[side] is None or set(releases[side] or ()) & LATE_INPLACE_RELEASES]
    if not late_sides or not bool(diff.any()):
        return on_grid(diff, mask), examples
    labels = ds["tensor"].values.tolist()
    index = {lbl: j for j, lbl in enumerate(labels)}
    d = np.asarray(diff.values, bool)
    for j in (int(x) for x in np.flatnonzero(d.any(axis=(0, 1)))):
        lbl = str(labels[j])
        if not lbl.endswith(".input.0"):
            continue
        node = lbl[: -len(".input.0")]
        k = index.get(node + ".output.0")
        if k is None or not node.endswith(".forward"):
            continue
        nn = parse_node(node)
        if nn.kind != "api" or not _in_place(nn.api):
            continue
        for side in late_sides:
            other = 1 - side
            hit = d[:, :, j] & ~d[:, :, k] & _equal(ds, side, j, k) & ~_equal(ds, other, j, k)
            hit &= np.asarray(ds["present"].values[other, :, :, k], bool)
            if hit.any():
                mask[:, :, j] |= hit
                si, ri = np.argwhere(hit)[0]
                examples.append({"tensor": lbl, "run": cmp.names[side], "releases": releases[side],
                                 "step": int(ds["step"].values[si]), "rank": int(ds["rank"].values[ri]),
                                 "count": int(hit.sum())})
                break
    return on_grid(diff, mask), examples


def late_inplace_text(examples: list[dict[str, Any]]) -> str:
    """The hint of :func:`late_inplace_inputs`' entries.

    Examples
    --------
    >>> late_inplace_text([{"tensor": "Tensor.__iadd__.0.forward.input.0", "run": "target", "releases": ["8.1.0",
    ...                     "8.1.1", "8.1.2"], "step": 0, "rank": 0, "count": 2}])[:96]
    'an in-place op input recorded after the op ran: Tensor.__iadd__.0.forward.input.0 in target (wri'
    """
    if not examples:
        return ""
    ex = examples[0]
    rel = ex["releases"]
    written = _span(rel)
    total = sum(e["count"] for e in examples)
    more = f" and {len(examples) - 1} more tensor(s)" if len(examples) > 1 else ""
    return (f"an in-place op input recorded after the op ran: {ex['tensor']} in {ex['run']} (written by {written}; "
            f"releases up to 1.1.1 record every in-place op's input after the op, 8.1.0–8.1.2 a 0-d one's), equal "
            f"to its own output while the other run recorded it before{more}: {total} record(s) set aside as a "
            "version difference, not a divergence")


#: releases that record no parameters and no parameter gradients
NO_PARAMETER_RELEASES = frozenset({"1.0.1", "1.0.3", "1.0.4", "1.1.0", "1.1.1"})


def _span(rel: list[str] | None) -> str:
    if not rel:
        return "an unknown release"
    return f"msprobe {rel[0]}" if len(rel) == 1 else f"msprobe {rel[0]}–{rel[-1]}"


def counters_continue(ds: xr.Dataset) -> dict[str, Any] | None:
    """API call (or parameter-gradient) counters that go on across steps instead of restarting, or None.

    As ``{"api", "kind", "step", "first_call", "previous_last"}``: msprobe 1.0.1 numbers API calls across
    steps, 26.0.0 parameter gradients. The counters of a kind go on when, for most of its families recorded
    at two consecutive steps, the step's smallest counter is above the previous step's largest.
    """
    if ds.sizes.get("step", 0) < 2 or ds.sizes.get("tensor", 0) == 0:
        return None
    present = np.asarray(np.asarray(ds["present"].values, bool).any(axis=1))  # (step, tensor)
    steps = [int(s) for s in ds["step"].values]
    calls: dict[tuple[str, str], dict[int, list[int]]] = {}
    kinds, apis, dirs, call = (ds[c].values for c in ("kind", "api", "direction", "call"))
    for j in range(ds.sizes["tensor"]):
        if call[j] < 0 or kinds[j] not in ("api", "param_grad") or (kinds[j] == "api" and dirs[j] != "forward"):
            continue
        key = (str(kinds[j]), str(apis[j]) if kinds[j] == "api" else "parameters_grad")
        per = calls.setdefault(key, {})
        for si in np.flatnonzero(present[:, j]):
            per.setdefault(steps[si], []).append(int(call[j]))
    for kind in ("api", "param_grad"):
        found: dict[str, Any] | None = None
        going = resetting = 0
        for (k, api), per in calls.items():
            if k != kind:
                continue
            for a, b in itertools.pairwise(sorted(per)):
                if min(per[b]) > max(per[a]):
                    going += 1
                    if found is None:
                        found = {"api": api, "kind": kind, "step": b, "first_call": min(per[b]),
                                 "previous_last": max(per[a])}
                else:
                    resetting += 1
        if found is not None and going > resetting:
            return found
    return None


def version_structural_hints(structural: list[dict[str, Any]], names: tuple[str, str],
                             runs: tuple[xr.Dataset, xr.Dataset]) -> list[str]:
    """What of the nodes recorded in one run only is how the runs' msprobe releases record.

    - parameter gradients only in one run, the other written by a release that records none (up to 1.1.1);
    - call counters that go on across steps in one run (:func:`counters_continue`): its later steps' records
      are named differently and are not paired by name.
    """
    hints: list[str] = []
    rel = (releases_of(runs[0]), releases_of(runs[1]))
    for side in (0, 1):
        other = 1 - side
        grads = [s for s in structural if s["only_in"] == names[side] and ".parameters_grad" in s["node"]]
        other_rel = rel[other]
        if grads and other_rel and set(other_rel) <= NO_PARAMETER_RELEASES:
            hints.append(f"{len(grads)} parameter-gradient record(s) only in {names[side]} (e.g. {grads[0]['node']}): "
                         f"{names[other]} was written by {_span(other_rel)}, which records no parameters and no "
                         "parameter gradients (from 1.2.0 on it does): a version difference")
    if structural:
        for side in (0, 1):
            c = counters_continue(runs[side])
            if c is None:
                continue
            what = "API call counters" if c["kind"] == "api" else "parameter-gradient counters (parameters_grad.N)"
            hints.append(f"{names[side]}'s {what} do not restart at each step (msprobe 1.0.1 numbers API calls, "
                         f"26.0.0 parameter gradients, across steps): at step {c['step']} its {c['api']} records are "
                         f"numbered from {c['first_call']} (step {c['step'] - 1} ended at {c['previous_last']}), so "
                         "those steps' records are not paired by name with the other run's: the records in one run "
                         f"only there are a version difference (written by {_span(rel[side])})")
    return hints

"""Call counters shifted on one rank at one step: the calls there paired by value, not by label.

msprobe numbers the calls of each API per rank and step (``Tensor.__mul__.9``). A call made on one rank at one step
only (a data-dependent branch, an expert that runs one op more) renumbers every later call of its API there: from it
on, a label names on that rank at that step the call the other run numbers one lower. The alignment pairs labels once
for every rank and step (:mod:`precnb.analysis.align`), so a comparison by label would set each shifted call against
its neighbour and report a value difference where one op more ran.

:func:`realign_shifted` looks where the number of an API's forward calls at a (step, rank) differs between the runs
otherwise than it does at most (step, rank) entries (the shared pairing holds there), pairs that API's calls there
in order (their counters': one rank's execution order, a merged run's whole-model order) by their values (a small
preference for the same label), and only where the values contradict the
shared pairing (a label's own counterpart holds other values, a neighbour's the same) moves the baseline's entries of
those calls, forward and backward, to their counterparts' labels at that step and rank. The call left without a
counterpart is then recorded in one run only there, as it ran, and is listed in the returned records. Runs recorded
alike (the same entries in both) are not looked at.

Examples
--------
>>> from precnb.schema import empty_dataset
>>> from precnb.combine import combine_runs
>>> realign_shifted(empty_dataset(), combine_runs({"a": empty_dataset(), "b": empty_dataset()}))[2]
[]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["realign_shifted"]

_DIMS = ("run", "step", "rank", "tensor")
_COUNTER = re.compile(r"\.(\d+)\.forward$")
RTOL = 2e-3
"""Scale-aware agreement of two calls' statistics that counts as the same values (float noise passes)."""
SAME_LABEL = 0.6
"""What the same label adds to a pair of calls (it pairs calls whose values cannot tell, never contradicted ones)."""
THRESHOLD = 0.5
"""The least score of a pair of calls: agreeing values, or the same label where the values cannot tell."""
BAND = 2
"""How far past the counts' difference a call may pair from its own label's position."""


def realign_shifted(b: xr.Dataset, both: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset, list[dict[str, Any]]]:
    """*b* and *both* with shifted call counters paired by value (the baseline's entries moved, see the module).

    Parameters
    ----------
    b : xarray.Dataset
        The baseline in the target's names, on the comparison's steps and ranks.
    both : xarray.Dataset
        Both runs on their common grid, ``run`` = (baseline, target).

    Returns
    -------
    (xarray.Dataset, xarray.Dataset, list of dict)
        The baseline and the pair (*b* and *both* themselves when nothing shifted), and one record per call made in
        one run only where it shifted its API's later labels: ``step``, ``rank``, ``api``, ``node``, ``tensor``,
        ``only_in`` (0 baseline, 1 target), ``seq``, ``renumbered`` (the calls paired with another label there),
        ``values`` (the statistics of its first tensor there, as recorded: a baseline call's entry is overwritten
        where another call moves to its label).
    """
    if not {"present", "node", "kind", "api", "direction"} <= set(both.variables) or both.sizes.get("run") != 2:
        return b, both, []
    pres = np.asarray(both["present"].transpose(*_DIMS).values, bool)
    pb, pt = pres[0], pres[1]
    if not pb.size:
        return b, both, []
    recorded = pb.any(axis=2) & pt.any(axis=2)
    if not ((pb != pt).any(axis=2) & recorded).any():  # recorded alike: the common case, one pass
        return b, both, []
    cand = _candidates(both, pb, pt, recorded)
    if not cand:
        return b, both, []
    grid = _Grid(both)
    moves: dict[tuple[int, int], list[tuple[int, int]]] = {}
    records: list[dict[str, Any]] = []
    for (si, ri), fam_nodes in cand.items():
        for nodes in fam_nodes:
            got = grid.repair(si, ri, nodes)
            if got is not None:
                moves.setdefault((si, ri), []).extend(got[0])
                records.extend(got[1])
    if not moves:
        return b, both, []
    records.sort(key=lambda d: (d["step"], d["seq"], d["rank"]))
    return _moved(b, _in_baseline(b, both, moves), run=False), _moved(both, moves), records


def _candidates(both: xr.Dataset, pb: np.ndarray, pt: np.ndarray, recorded: np.ndarray
                ) -> dict[tuple[int, int], list[list[str]]]:
    """Per (step, rank) index: the forward nodes of each API whose count there differs unusually between the runs.

    The difference of counts (target less baseline) is compared with its most frequent value over the (step,
    rank) entries both runs recorded (of equally frequent ones, the smallest): an API whose calls differ alike
    everywhere (a layout's glue) is paired as the alignment paired it, and where one (step, rank) is all there is,
    the alignment, which paired that one, holds.
    """
    kind, direction = both["kind"].values, both["direction"].values
    fwd = np.flatnonzero((kind == "api") & (direction == "forward"))
    if not len(fwd):
        return {}
    node = both["node"].values[fwd].astype(str)
    uniq, inv = np.unique(node, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(inv[order]) != 0])
    cols = fwd[order]
    fam = both["api"].values[cols[starts]].astype(str)
    fams, fam_of = np.unique(fam, return_inverse=True)
    by_fam = np.argsort(fam_of, kind="stable")
    fam_starts = np.flatnonzero(np.r_[True, np.diff(fam_of[by_fam]) != 0])

    def counts(p: np.ndarray) -> np.ndarray:
        per_node = np.logical_or.reduceat(p[:, :, cols], starts, axis=2)  # (step, rank, node)
        return np.add.reduceat(per_node[:, :, by_fam].astype(np.int64), fam_starts, axis=2)  # (step, rank, api)

    cb, ct = counts(pb), counts(pt)
    d = ct - cb
    out: dict[tuple[int, int], list[list[str]]] = {}
    for f in range(len(fams)):
        seen = d[:, :, f][recorded]
        vals, n = np.unique(seen, return_counts=True)
        top = vals[n == n.max()]
        usual = top[np.argmin(np.abs(top))]  # of equally frequent differences, the smallest (none, if it is one)
        hit = recorded & (d[:, :, f] != usual) & (cb[:, :, f] > 0) & (ct[:, :, f] > 0)
        if not hit.any():
            continue
        members = by_fam[fam_starts[f]:(fam_starts[f + 1] if f + 1 < len(fams) else len(by_fam))]
        names = [str(uniq[k]) for k in members]
        for si, ri in np.argwhere(hit).tolist():
            out.setdefault((si, ri), []).append(names)
    return out


class _Grid:
    """The combined runs read per (step, rank): each node's columns, presence, order and statistics."""

    def __init__(self, both: xr.Dataset) -> None:
        self.both = both
        labels = both["tensor"].values
        self.col = {str(t): j for j, t in enumerate(labels.tolist())}
        self.cols: dict[str, list[int]] = {}
        for j, n in enumerate(both["node"].values.tolist()):
            self.cols.setdefault(str(n), []).append(j)
        self.labels = [str(t) for t in labels.tolist()]
        self.pres = both["present"].transpose(*_DIMS).values
        self.seq = both["seq"].transpose(*_DIMS).values if "seq" in both else None
        self.stat_names = [s for s in ("max", "min", "mean", "norm") if s in both]
        self.stats = [both[s].transpose(*_DIMS).values for s in self.stat_names]
        self.steps = both["step"].values.tolist()
        self.ranks = both["rank"].values.tolist()

    def _calls(self, side: int, si: int, ri: int, nodes: Sequence[str]) -> list[str]:
        """The nodes among *nodes* recorded by *side* at (si, ri), in call order (their counters).

        The counters order one rank's calls as they ran, and a merged run's as the whole model runs them (the
        records of a merged run interleave its ranks' orders).
        """
        out = []
        for n in nodes:
            cs = [c for c in self.cols.get(n, []) if self.pres[side, si, ri, c]]
            if cs:
                q = min(int(self.seq[side, si, ri, c]) for c in cs) if self.seq is not None else 0
                m = _COUNTER.search(n)
                out.append((int(m.group(1)) if m else q, q, n))
        return [n for _c, _q, n in sorted(out)]

    def _value_score(self, si: int, ri: int, nb: str, nt: str) -> float:
        """How much the statistics of baseline call *nb* and target call *nt* agree (slot by slot, weighted)."""
        s = 0.0
        for c in self.cols.get(nb, []):
            j = self.col.get(nt + self.labels[c][len(nb):])
            if j is None or not self.pres[0, si, ri, c] or not self.pres[1, si, ri, j]:
                continue
            a = [float(x[0, si, ri, c]) for x in self.stats]
            b = [float(x[1, si, ri, j]) for x in self.stats]
            w = _weight(a)
            if w:
                s += w if _close(a, b) else -w
        return s

    def repair(self, si: int, ri: int, nodes: Sequence[str]
               ) -> tuple[list[tuple[int, int]], list[dict[str, Any]]] | None:
        """The column moves of the baseline at (si, ri) that pair these calls by value, and the calls left alone.

        None when the values do not contradict the shared pairing (the same label is the counterpart), or when
        the pairing by value does not account for every call of the run with fewer of them.
        """
        xs, ys = self._calls(0, si, ri, nodes), self._calls(1, si, ri, nodes)
        if not xs or not ys:
            return None
        vals: dict[tuple[int, int], float] = {}

        def score(i: int, j: int) -> float:
            if (i, j) not in vals:
                vals[(i, j)] = self._value_score(si, ri, xs[i], ys[j])
            return vals[(i, j)] + (SAME_LABEL if xs[i] == ys[j] else 0.0)

        pairs = _in_order(len(xs), len(ys), score, len(ys) - len(xs))
        if not any(xs[i] != ys[j] and vals[(i, j)] >= 1.0 for i, j in pairs):
            return None  # no call paired by its values with another label: the shared pairing holds
        pairs = _fill_gaps(pairs, len(xs), len(ys))
        if len(pairs) != min(len(xs), len(ys)):
            return None
        moves: list[tuple[int, int]] = []
        for i, j in pairs:
            if xs[i] != ys[j]:
                moves.extend(self._node_moves(xs[i], ys[j]))
        paired = ({i for i, _ in pairs}, {j for _, j in pairs})
        moved = sum(xs[i] != ys[j] for i, j in pairs)
        out = []
        for side, calls in ((0, xs), (1, ys)):
            for k, n in enumerate(calls):
                if k not in paired[side]:
                    cs = [c for c in self.cols[n] if self.pres[side, si, ri, c]]
                    q = min(int(self.seq[side, si, ri, c]) for c in cs) if self.seq is not None else -1
                    out.append({"step": int(self.steps[si]), "rank": int(self.ranks[ri]), "node": n,
                                "api": str(self.both["api"].values[cs[0]]), "only_in": side, "seq": q,
                                "tensor": self.labels[cs[0]], "renumbered": int(moved),
                                "values": dict(zip(self.stat_names, (float(x[side, si, ri, cs[0]])
                                                                     for x in self.stats), strict=True))})
        return moves, out

    def _node_moves(self, nb: str, nt: str) -> list[tuple[int, int]]:
        """(source, destination) columns of baseline node *nb* moved to target node *nt*, its backward node too."""
        out = []
        names = [(nb, nt)]
        if nb.endswith(".forward") and nt.endswith(".forward"):
            names.append((nb[: -len("forward")] + "backward", nt[: -len("forward")] + "backward"))
        for a, b in names:
            for c in self.cols.get(a, []):
                j = self.col.get(b + self.labels[c][len(a):])
                out.append((c, -1 if j is None else j))
        return out


def _weight(a: list[float]) -> float:
    """What agreeing statistics prove: a varied tensor 1, a constant 0.2, nothing recorded 0."""
    if not a or all(np.isnan(x) for x in a[:2]):
        return 0.0
    return 0.2 if a[0] == a[1] else 1.0


def _close(a: list[float], b: list[float]) -> bool:
    """Whether two statistics tuples agree scale-aware (NaN = NaN, inf = inf; the norm on its own scale).

    >>> _close([1.0, -1.0, 0.0, 3.0], [1.0, -1.0, 1e-9, 3.000001]), _close([np.inf, 0, 0, 1], [9.0, 0, 0, 1])
    (True, False)
    """
    fa, fb = np.asarray(a, np.float64), np.asarray(b, np.float64)
    first = np.r_[fa[:3], fb[:3]]
    finite = np.abs(first[np.isfinite(first)])
    scale = np.full(len(fa), max(float(finite.max()) if finite.size else 0.0, 1e-30))
    if len(fa) > 3:
        scale[3] = max(abs(fa[3]), abs(fb[3]), 1e-30) if np.isfinite(fa[3] + fb[3]) else 1e-30
    with np.errstate(invalid="ignore"):
        ok = (np.isnan(fa) & np.isnan(fb)) | (fa == fb) | (np.abs(fa - fb) <= RTOL * scale)
    return bool(ok.all())


def _in_order(n: int, m: int, score: Any, shift: int) -> list[tuple[int, int]]:
    """The order-preserving pairs ``(i, j)`` of highest summed gain (scores at or above :data:`THRESHOLD`).

    The path stays within :data:`BAND` of the diagonals the counts allow (``j - i`` between 0 and *shift*): a shift
    by one call pairs each call with its own label or the next one, and the programme costs ``n × (|shift| + 5)``.
    On equal totals a pair is preferred, then skipping a baseline call.

    >>> _in_order(3, 4, lambda i, j: 1.0 if j == i + (i > 0) else 0.0, 1)
    [(0, 0), (1, 2), (2, 3)]
    """
    lo = min(0, shift) - BAND
    width = max(0, shift) + BAND - lo + 1
    best = np.full((n + 1, width), -np.inf)
    move = np.zeros((n + 1, width), np.int8)  # 0 pair, 1 skip a baseline call, 2 skip a target call
    for i in range(n + 1):
        for k in range(width):
            j = i + lo + k
            if j < 0 or j > m:
                continue
            if i == 0 and j == 0:
                best[0, k] = 0.0
                continue
            b, mv = -np.inf, 1
            if i > 0 and k + 1 < width:
                b = best[i - 1, k + 1]
            if k > 0 and best[i, k - 1] > b:
                b, mv = best[i, k - 1], 2
            if i > 0 and j > 0 and best[i - 1, k] > -np.inf:
                s = score(i - 1, j - 1)
                if s >= THRESHOLD and best[i - 1, k] + s - THRESHOLD + 1e-3 >= b:
                    b, mv = best[i - 1, k] + s - THRESHOLD + 1e-3, 0
            best[i, k], move[i, k] = b, mv
    out = []
    i, k = n, m - n - lo
    while i > 0 and i + lo + k > 0:
        if move[i, k] == 0:
            out.append((i - 1, i + lo + k - 1))
            i -= 1
        elif move[i, k] == 1:
            i, k = i - 1, k + 1
        else:
            k -= 1
    return out[::-1]


def _fill_gaps(pairs: list[tuple[int, int]], n: int, m: int) -> list[tuple[int, int]]:
    """*pairs* with each gap of as many calls on both sides between two pairs (or an end) paired in order."""
    out: list[tuple[int, int]] = []
    pi = pj = 0
    for i, j in [*pairs, (n, m)]:
        if i - pi == j - pj:
            out.extend((pi + k, pj + k) for k in range(i - pi))
        if i < n:
            out.append((i, j))
        pi, pj = i + 1, j + 1
    return out


def _in_baseline(b: xr.Dataset, both: xr.Dataset, moves: dict[tuple[int, int], list[tuple[int, int]]]
                 ) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The moves of the combined grid's columns in *b*'s own columns, steps and ranks (-1: no such label in *b*)."""
    col = b.indexes["tensor"].get_indexer(both["tensor"].values)
    steps, ranks = b.indexes["step"], b.indexes["rank"]
    out = {}
    for (si, ri), mv in moves.items():
        at = (steps.get_loc(both["step"].values[si]), ranks.get_loc(both["rank"].values[ri]))
        out[at] = [(int(col[a]), int(col[d]) if d >= 0 else -1) for a, d in mv if col[a] >= 0]
    return out


def _moved(ds: xr.Dataset, moves: dict[tuple[int, int], list[tuple[int, int]]], *, run: bool = True
           ) -> xr.Dataset:
    """*ds* with the baseline's entries moved between columns at each (step, rank) (sources emptied first).

    *run*: *ds* holds both runs (the baseline is ``run`` 0); else it is the baseline alone.
    """
    from precnb.combine import _fill_for

    dims = _DIMS if run else _DIMS[1:]
    new = {}
    for name, var in ds.data_vars.items():
        if not set(dims) <= set(var.dims):
            continue
        tv = var.transpose(*dims, ...)
        arr = np.array(tv.values)  # a copy
        body = arr[0] if run else arr  # a view
        fill = _fill_for(var)
        for (si, ri), mv in moves.items():
            row = body[si, ri]
            src = np.asarray([a for a, _d in mv], np.int64)
            dst = np.asarray([d for _a, d in mv], np.int64)
            vals = row[src].copy()
            row[src] = fill
            row[dst[dst >= 0]] = vals[dst >= 0]
        new[name] = tv.copy(data=arr).transpose(*var.dims)
    return ds.assign(new)

"""The fast path of call pairing: prove that equal names are what the dynamic programme would pair.

Runs whose names already agree (the same code, a resumed run, one op more or less) pair their
API calls one to one by name. :func:`certified_pairs` finds that pairing, scores only its pairs
and proves, with cheap upper bounds on every other score, that the order-preserving programme
of :func:`precnb.analysis.align.match.pair_in_order` would choose exactly these pairs: then its
answer *is* the programme's, without the ``n × m`` scores. Where the proof does not go through
(names differ, or a score could compete), it returns None and the programme runs as before.

The proof. The programme maximises the summed gain ``g(i, j) = s(i, j) - threshold + 1e-3 -
1e-7 (i + j)`` over order-preserving pairings of cells with ``s >= threshold``. Potentials
``u`` (rows) and ``v`` (columns), both ``>= 0`` with ``u_i + v_j >= g(i, j)`` on every such cell,
bound every pairing's total by ``sum(u) + sum(v)`` (linear-programming duality, order or not).
Take ``v_j`` = the best gain of a row without a name partner on column ``j`` (0 if none), ``u_i``
= the name pair's gain minus its column's ``v``, 0 for rows without a partner: the name pairing
totals exactly ``sum(u) + sum(v)``. If moreover every ``u_i`` is positive, every other cell stays
below ``u_i + v_j`` by a margin and no two calls without partners could pair, every other pairing
falls short by at least the margin: the name pairing is the programme's unique optimum. Scores
are computed only for the name pairs and for the cells whose cheap bound (:class:`ApiBound`)
does not already settle the inequality.

Examples
--------
>>> name_partners(["a", "b", "c"], ["a", "x", "c"])
[0, None, 2]
>>> name_partners(["a", "b"], ["b", "a"]) is None  # crossed: not order-preserving
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from precnb.analysis.align.evidence import information
from precnb.analysis.align.tree import NodeInfo
from precnb.analysis.align.vocab import is_glue_op, op_similarity

__all__ = ["ApiBound", "certified_pairs", "name_partners"]

MARGIN = 1e-6
"""How much the proven pairing must beat every alternative by (far above float rounding)."""

_SLACK = 1e-9  # bounds are summed in another order than the score: a few ulps of room


def name_partners(names_a: Sequence[str], names_b: Sequence[str], *, min_share: float = 0.5
                  ) -> list[int | None] | None:
    """For each name of *names_a*, the position of the same name in *names_b* (None: no such name).

    None when the shared names are not in the same order on both sides, or when fewer than
    *min_share* of the longer side's names are shared (the names do not agree).
    """
    pos = {n: j for j, n in enumerate(names_b)}
    out: list[int | None] = []
    last = -1
    shared = 0
    for n in names_a:
        j = pos.get(n)
        if j is not None:
            if j <= last:
                return None
            last = j
            shared += 1
        out.append(j)
    if shared < min_share * max(len(names_a), len(names_b), 1):
        return None
    return out


class ApiBound:
    """Upper bounds of :meth:`precnb.analysis.align.pairing._Aligner.api_score` without hints.

    ``api_score(x, y) = 1.4 sim + numel term (+0.5 / -0.6 when both have outputs) +
    node_values(x, y) (outputs: at most 1.6 × the smaller best information of their first three
    outputs; inputs: at most 0.5 × min(1, information of x's first four inputs)) - 1 (sim = 0 and
    a glue op) + 1 (same name, one framework)``, and across two codebases (*cross_codebase*) up to
    0.8 more where ``sim < 1`` (one value computed by other ops). The bound keeps every positive
    term at its largest and drops the same-name term (it is used for cells whose names differ);
    columns are grouped by API, so a row's bound against every column costs one term per API.
    """

    def __init__(self, ys: Sequence[NodeInfo], *, cross_codebase: bool = False) -> None:
        self.cross_codebase = cross_codebase
        self.groups: dict[str, list[int]] = {}
        self._col: dict[str, tuple[bool, float, bool]] = {}  # api -> (any outputs, best output info, any inputs)
        for j, y in enumerate(ys):
            self.groups.setdefault(y.api, []).append(j)
            has_out, info_out, has_in = self.features(y)
            o, i, n = self._col.get(y.api, (False, 0.0, False))
            self._col[y.api] = (o or has_out, max(i, info_out), n or has_in)
        self._glue = {api: is_glue_op(api) for api in self.groups}

    @staticmethod
    def features(x: NodeInfo) -> tuple[bool, float, bool]:
        """(has outputs, best information of its first three outputs, has inputs)."""
        outs = x.outputs
        return bool(outs), max((information(t) for t in outs[:3]), default=0.0), bool(x.inputs)

    def rows(self, xs: Sequence[NodeInfo]) -> list[dict[str, float]]:
        """:meth:`row` of each of *xs* (calls alike in what a row reads share one row: read-only)."""
        made: dict[tuple[str, bool, float, bool, float], dict[str, float]] = {}
        out = []
        for x in xs:
            key = (x.api, *self.features(x), self._in_hits(x))
            row = made.get(key)
            if row is None:
                row = made[key] = self.row(x)
            out.append(row)
        return out

    @staticmethod
    def _in_hits(x: NodeInfo) -> float:
        ins = x.inputs
        return min(sum(information(t) for t in ins[:4]), 1.0) if ins else 0.0

    def row(self, x: NodeInfo) -> dict[str, float]:
        """For each API of the columns: a bound of ``api_score(x, y)`` over its columns y (names differing)."""
        has_out, info_out, has_in = self.features(x)
        in_hits = self._in_hits(x)
        glue_x = is_glue_op(x.api)
        out: dict[str, float] = {}
        for api, (c_out, c_info, c_in) in self._col.items():
            sim = op_similarity(x.api, api)
            s = 1.4 * sim
            if has_out and c_out:
                s += 0.5 + 1.6 * min(info_out, c_info)
            if has_in and c_in:
                s += 0.5 * in_hits
            if sim == 0.0 and (glue_x or self._glue[api]):
                s -= 1.0
            elif sim < 1.0 and self.cross_codebase:
                s += 0.8
            out[api] = s + _SLACK
        return out


def certified_pairs(xs: Sequence[NodeInfo], ys: Sequence[NodeInfo], score: Callable[[Any, Any], float], *,  # noqa: C901
                    threshold: float) -> list[tuple[int, int, float]] | None:
    """The pairs the order-preserving programme makes, when equal names provably are them; else None.

    Parameters
    ----------
    xs, ys : sequence of NodeInfo
        The calls of both sides, in execution order.
    score : callable
        ``score(x, y)``: the aligner's API score (without hints; :class:`ApiBound` bounds it).
    threshold : float

    Returns
    -------
    list of (int, int, float) or None
        The best pairing of all (by a margin), which is what :func:`precnb.analysis.align.match.pair_in_order`
        returns for these inputs when each pair is among the cells its programme weighs
        (:func:`~precnb.analysis.align.match.programme_cells`: every cell of a short scope, the band around the
        anchors of a long one), or None (not proven).
    """
    partners = name_partners([x.name for x in xs], [y.name for y in ys])
    if partners is None:
        return None
    bound = ApiBound(ys)

    def gain(s: float, i: int, j: int) -> float:  # the programme's gain of a cell (match._dp)
        return s - threshold + 1e-3 - 1e-7 * (i + j)

    pair_score: dict[int, float] = {}
    for i, p in enumerate(partners):
        if p is not None:
            s = float(score(xs[i], ys[p]))
            if s >= threshold:
                pair_score[i] = s
    col_of = {i: partners[i] for i in pair_score}
    matched_cols = set(col_of.values())
    # pass 1: rows without a partner. Their cells at the threshold must fall on partnered columns; each
    # such column gets the best of those gains as its potential v (the row's own potential is 0)
    v: dict[int, float] = {}
    rows = bound.rows(xs)
    for i, x in enumerate(xs):
        if i in pair_score:
            continue
        for api, ub in rows[i].items():
            if ub < threshold:
                continue
            for j in bound.groups[api]:
                s = float(score(x, ys[j]))
                if s < threshold:
                    continue
                if j not in matched_cols:
                    return None  # two calls without partners could pair with each other
                v[j] = max(v.get(j, 0.0), gain(s, i, j))
    # pass 2: partnered rows. Potential u = gain - v of its column > 0, and every other cell at the
    # threshold must stay below u + v of its column by the margin
    out: list[tuple[int, int, float]] = []
    for i, x in enumerate(xs):
        if i not in pair_score:
            continue
        p = col_of[i]
        s_p = pair_score[i]
        u = gain(s_p, i, p) - v.get(p, 0.0)  # type: ignore[arg-type]
        if u <= MARGIN:
            return None
        for api, ub in rows[i].items():
            if ub < threshold or gain(ub, i, 0) < u - MARGIN:
                continue  # below the threshold, or below u + v for every column (v >= 0)
            for j in bound.groups[api]:
                if j == p:
                    continue
                s = float(score(x, ys[j]))
                if s >= threshold and gain(s, i, j) >= u + v.get(j, 0.0) - MARGIN:
                    return None
        out.append((i, p, s_p))  # type: ignore[arg-type]
    return out

"""What the first-divergence search judges before it looks for an origin: the pair's differences and notes.

:func:`judge` turns a :class:`~precnb.analysis.compare.Comparison` into a :class:`Judged` pair: the
differences searched (CRC ones with ``crc="strict"``; less what one msprobe release or one framework
only records differently), the finding's ``stats``, its hints, the structural differences and what was
set aside. :func:`no_divergence` is the finding when no difference is left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis.compare import Comparison
from precnb.analysis.compare.compared import compared_part
from precnb.analysis.divergence.crossfw import _drop_isolated, two_frameworks
from precnb.analysis.divergence.hints import grad_ratio_hint, ratio_hint, structural_hints, zero_parameter_hints
from precnb.analysis.divergence.structural import structural_differences
from precnb.analysis.divergence.versions import (
    late_inplace_inputs,
    late_inplace_text,
    releases_of,
    version_structural_hints,
)
from precnb.analysis.findings import Finding

__all__ = ["MAX_LISTED", "Judged", "judge", "no_divergence"]

MAX_LISTED = 200


@dataclass
class Judged:
    """A compared pair as the search judges it (built by :func:`judge`; the origin search adds to it)."""

    cmp: Comparison
    alignment: Any  # the Alignment the pair was compared with (identity or None when names are compared as-is)
    aligned: bool  # an alignment that renames something
    inputs: tuple[xr.Dataset, xr.Dataset]  # the runs as passed (before the comparison's selection)
    b: xr.Dataset  # the comparison's baseline and target, in the target's names
    t: xr.Dataset
    diff: xr.DataArray  # (step, rank, tensor): the differences searched
    seq: xr.DataArray  # execution order: the baseline's, the target's where the baseline has none
    stats: dict[str, Any]
    structural: list[dict[str, Any]]
    crc_only: list[dict[str, Any]]
    aside: list[dict[str, Any]]  # set aside by construction, then each codebase's own organisation
    hints: list[str] = field(default_factory=list)
    isolated: list[dict[str, Any]] = field(default_factory=list)
    part: str | None = None  # "compared N of M ..." when only part of the runs was compared
    carried: Any = None  # (step, rank, tensor) differences the ops' own operands explain (left out of ``diff``)

    @property
    def names(self) -> tuple[str, str]:
        """The runs' names (baseline, target)."""
        return self.cmp.names

    @property
    def struct_out(self) -> list[dict[str, Any]]:
        """The finding's ``structural`` list (at most :data:`MAX_LISTED` entries)."""
        return [{"node": s["node"], "only_in": s["only_in"], "step": s["step"], "rank": s["rank"],
                 "count": s["count"]} for s in self.structural[:MAX_LISTED]]


def _pair_stats(cmp: Comparison, diff: xr.DataArray, crc: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The finding's first ``stats`` (record counts, steps, ranks, offset) and its ``crc_only`` list."""
    ds, names = cmp.ds, cmp.names
    crc_only_idx = np.argwhere(cmp.crc_only.values) if crc == "report" else np.zeros((0, 3), int)
    crc_only = [{"step": int(ds["step"].values[s]), "rank": int(ds["rank"].values[r]),
                 "tensor": str(ds["tensor"].values[t])} for s, r, t in crc_only_idx[:MAX_LISTED]]
    stats = {
        "compared_records": int(cmp.both.sum()),
        "differing_records": int(diff.sum()),
        "crc_only_records": int(cmp.crc_only.sum()),
        "only_in_" + names[0]: int(cmp.only_baseline.sum()),
        "only_in_" + names[1]: int(cmp.only_target.sum()),
        "steps": [int(s) for s in ds["step"].values],
        "ranks": [int(r) for r in ds["rank"].values],
        "step_offset": cmp.step_offset,
    }
    return stats, crc_only


def _dtype_note_text(notes: dict[str, tuple[str, str, str]], names: tuple[str, str]) -> str:
    """One hint for the tensors whose dtypes differ but hold the same values."""
    shown = [f"{lbl}: {a} in {names[0]} vs {b} in {names[1]} ({why})" for lbl, (a, b, why) in list(notes.items())[:3]]
    more = f"; and {len(notes) - 3} more" if len(notes) > 3 else ""
    return (f"{len(notes)} tensor(s) differ in dtype only (the same values in another dtype: compared on their "
            f"statistics, the dtype is not a difference): {'; '.join(shown)}{more}")


def _aside_hints(own: list[dict[str, Any]], codebase: list[dict[str, Any]]) -> list[str]:
    """What was set aside: by construction (entries), and as each codebase's own organisation (nodes)."""
    hints = []
    if own:
        hints.append("set aside, not compared (by construction): " + "; ".join(
            f"{a['entries']} differing entr{'y' if a['entries'] == 1 else 'ies'} {a['why']} (e.g. "
            f"{a['examples'][0]['tensor']})" for a in own))
    if codebase:
        hints.append("set aside, not compared (each codebase's own organisation): " + "; ".join(
            f"{sum(a['nodes'].values())} node(s) {a['why'].removeprefix('organisation: ')} (e.g. "
            f"{a['examples'][0]['node']})" for a in codebase[:4]))
    return hints


def _pair_hints(j: Judged) -> list[str]:
    """The pair's hints: precision and tensor data used, dtype notes, ratios, zero parameters, structure."""
    cmp, names, stats = j.cmp, j.names, j.stats
    # -- issue #17 hook: say how precision and tensor data were used (precnb.analysis.tensor.findings)
    from precnb.analysis.tensor.findings import comparison_notes

    hints: list[str] = []
    hints += comparison_notes(cmp, stats)
    if cmp.dtype_notes:  # dtypes that hold the same values (precnb.dtypes): a note on the pair, not a difference
        stats["dtype_notes"] = {k: {names[0]: a, names[1]: c, "why": why}
                                for k, (a, c, why) in list(cmp.dtype_notes.items())[:MAX_LISTED]}
        hints.append(_dtype_note_text(cmp.dtype_notes, names))
    world = int(cmp.ds.sizes["rank"])
    gh = grad_ratio_hint(j.b, j.t, cmp.both, world, names) or ratio_hint(j.b, j.t, j.diff, world, names)
    if gh:
        hints.append(gh)
    hints += zero_parameter_hints(j.b, j.t, cmp.both, names)
    hints += structural_hints(j.structural, names)
    hints += version_structural_hints(j.structural, names, j.inputs)
    return hints


def _drop_recording_differences(j: Judged) -> None:
    """Leave out of ``j.diff`` what one msprobe release or one framework only records differently."""
    late, late_ex = late_inplace_inputs(j.cmp, j.diff, releases=(releases_of(j.inputs[0]), releases_of(j.inputs[1])))
    if late_ex:  # how one run's msprobe release records in-place ops: a version difference
        j.diff = j.diff & ~late
        j.stats["version_differences"] = int(late.sum())
        j.hints.append(late_inplace_text(late_ex))
    if two_frameworks(j.alignment):  # two frameworks record some backward ops differently
        j.diff, j.isolated = _drop_isolated(j.diff, j.seq, j.cmp)
    from precnb.analysis.divergence.carried import CARRY, carried_differences

    carried = carried_differences(j)
    if carried.any():  # noise that the op's own inputs explain: carried, not created
        j.carried = carried
        j.diff = j.diff & ~carried
        j.stats["carried_differences"] = int(carried.sum())
        j.hints.append(f"{int(carried.sum())} difference(s) beyond tolerance are carried, not created: each op's "
                       f"output differs by at most {CARRY:g}x its inputs' difference (or its input by at most "
                       f"{CARRY:g}x the output that produced it): carried from an earlier difference (or accumulated "
                       "rounding noise), not an origin")
    if j.isolated:
        iso = j.isolated
        j.stats["isolated_differences"] = len(iso)
        j.hints.append(f"{len(iso)} difference(s) did not propagate (the records right after agree again), "
                       f"e.g. {iso[0]['tensor']} at step {iso[0]['step']}: a recording difference "
                       "(what the two runs capture at that op), not a divergence")


def judge(cmp: Comparison, inputs: tuple[xr.Dataset, xr.Dataset], alignment: Any, crc: str) -> Judged:
    """The pair *cmp* as the search judges it.

    Parameters
    ----------
    cmp : Comparison
        The pair compared (:func:`~precnb.analysis.divergence.search.pair_comparison`).
    inputs : (xarray.Dataset, xarray.Dataset)
        The baseline and target as the caller passed them (their releases, their record counts).
    alignment : Alignment or None
        The alignment *cmp* was compared with.
    crc : {"report", "strict"}
        ``"strict"``: CRC differences count as differences.

    Returns
    -------
    Judged
    """
    aligned = alignment is not None and not alignment.identical
    diff = cmp.differs | cmp.crc_differs if crc == "strict" else cmp.differs
    stats, crc_only = _pair_stats(cmp, diff, crc)
    if aligned:
        stats["alignment"] = alignment.summary()
    own_aside = cmp.set_aside()
    if own_aside:
        stats["set_aside_entries"] = sum(a["entries"] for a in own_aside)
    # two codebases: the calls the alignment set aside as their organisation (masks, identity dropout, ...)
    codebase_aside = alignment.set_aside() if aligned else []
    if cmp.calibration is not None:
        stats["cross_framework_noise"] = cmp.calibration
    b, t = cmp.ds.isel(run=0), cmp.ds.isel(run=1)
    j = Judged(cmp=cmp, alignment=alignment, aligned=aligned, inputs=inputs, b=b, t=t, diff=diff,
               seq=b["seq"].where(b["seq"] >= 0, t["seq"]), stats=stats, structural=structural_differences(cmp),
               crc_only=crc_only, aside=own_aside + codebase_aside)
    j.hints = _pair_hints(j) + _aside_hints(own_aside, codebase_aside)
    _drop_recording_differences(j)
    from precnb.analysis.divergence.random_draws import set_aside_random_draws

    set_aside_random_draws(j)  # a random draw the layouts change by design: the runs' horizon
    j.part = compared_part(int(cmp.both.sum()), *inputs, j.names, stats)
    return j


def no_divergence(j: Judged) -> Finding:
    """The ``none`` finding: no value difference beyond tolerance (and what was compared, noted, set aside)."""
    stats, cmp = j.stats, j.cmp
    reason = "no value divergence beyond tolerance"
    if j.part:
        reason += f" ({j.part})"
    if j.structural:
        reason += f"; {len(j.structural)} node(s) recorded in one run only"
    if stats["crc_only_records"]:
        reason += (f"; {stats['crc_only_records']} CRC-only difference(s) with identical statistics "
                   "(typically in-place ops whose checksum is taken while the buffer changes)")
    if cmp.precision is not None and cmp.precision.systematic:
        reason += f"; {cmp.precision.statement()}"
    horizon = stats.get("horizon")
    if horizon:
        reason += (f" before {horizon['node']} (step {horizon['step']}, rank {horizon['rank']}), a random op that "
                   "differs by design (its draw depends on the layout): not compared past it")
    evidence: dict[str, Any] = {"alignment": j.alignment.describe()} if j.aligned else {}
    if j.aside:
        evidence["set_aside"] = j.aside
    if j.isolated:
        evidence["isolated_differences"] = j.isolated[:MAX_LISTED]
    return Finding(kind="none", reason=reason, structural=j.struct_out, crc_only=j.crc_only,
                   hints=j.hints, stats=stats, evidence=evidence)

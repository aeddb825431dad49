"""What the pipeline assumed about its inputs, as data: every finding and every front end says it.

An *assumption* is something :func:`precnb.diagnose` decided that the user did not give and the
answer depends on. Each is a dict with ``kind``, ``text`` (one line, for people) and the values
it rests on:

* ``inferred_layout`` — a run's parallel layout read from its dumps (``role``: ``target`` /
  ``baseline``; ``layout``, e.g. ``"tp=2"``; ``why``: the dumps' evidence); never when the layout
  was given (``--target-layout`` / ``--baseline-layout``);
* ``step_offset`` — the pair's step offset detected from the parameters' statistics because the
  runs hold other step numbers and none was given (``offset``; ``baseline_steps``,
  ``target_steps``);
* ``aligned_by_structure`` / ``aligned_by_shape`` / ``aligned_by_value`` — nodes of two runs
  whose names differ, paired by their place in the module tree, by tensor shapes, or by equal
  values (``count``; ``examples``: a few ``{"baseline", "target"}`` pairs). Pairs by name, or
  from the user's mapping file, are not assumptions.

The pipeline collects them once (:func:`collect`) into :attr:`precnb.pipeline.Triage.assumptions`
and copies them into every finding (``Finding.assumptions``, the ``assumptions`` list of the
``precnb.finding/1`` JSON, also when nothing is found); the command line prints them under
``assumed:``, the HTML report and the explorer show them.

Examples
--------
>>> a = inferred_layout("target", "tp=2", ["8 of 8 tensor-parallel groups agree"])
>>> a["kind"], a["layout"], a["text"]
('inferred_layout', 'tp=2', 'target layout tp=2 read from the dumps (not given): 8 of 8 tensor-parallel groups agree')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["attach", "collect", "inferred_layout", "layout_spec", "step_offset"]

_BY = {"structure": "their place in the module tree", "shape": "their tensor shapes", "value": "equal values"}


def layout_spec(layout: Any) -> str:
    """The short, ``--target-layout``-style spelling of a :class:`~precnb.analysis.Layout` (its sizes above 1).

    Examples
    --------
    >>> from precnb.analysis import Layout
    >>> layout_spec(Layout(4, tp=2, pp=2)), layout_spec(Layout(2)), layout_spec(Layout(4, tp=2, order="tp-dp-pp-cp-ep"))
    ('tp=2,pp=2', 'dp=2', 'tp=2,dp=2,order=tp-dp-pp-cp-ep')
    """
    parts = [f"{d}={getattr(layout, d)}" for d in ("tp", "cp", "ep", "dp", "pp", "vpp") if getattr(layout, d) > 1]
    if getattr(layout, "ep", 1) > 1 and getattr(layout, "etp", layout.tp) != layout.tp:
        parts.insert(parts.index(f"ep={layout.ep}") + 1, f"etp={layout.etp}")
    if layout.order != "tp-cp-ep-dp-pp":
        parts.append(f"order={layout.order}")
    return ",".join(parts) or "dp=1"


def inferred_layout(role: str, layout: Any, evidence: Sequence[str]) -> dict[str, Any]:
    """The assumption that *role*'s run has *layout* (a Layout, or its spec), read from its dumps for *evidence*."""
    why = "; ".join(str(e) for e in evidence)
    spec = layout if isinstance(layout, str) else layout_spec(layout)
    out = {"kind": "inferred_layout", "role": role, "layout": spec, "why": why,
           "text": f"{role} layout {spec} read from the dumps (not given)" + (f": {why}" if why else "")}
    if not isinstance(layout, str):
        out["describe"] = layout.describe()
    return out


def step_offset(offset: int, baseline_steps: Sequence[int], target_steps: Sequence[int]) -> dict[str, Any]:
    """The assumption that target step = baseline step + *offset* (detected, not given).

    Examples
    --------
    >>> a = step_offset(3, [0, 1, 2, 3], [3, 4])
    >>> a["offset"], a["text"].split("; ")[1]
    (3, 'baseline steps 0-3, target steps 3-4)')
    """
    from precnb.analysis.summary import format_ranges

    b, t = sorted(int(s) for s in baseline_steps), sorted(int(s) for s in target_steps)
    return {"kind": "step_offset", "offset": int(offset), "how": "detected from parameter statistics",
            "baseline_steps": b, "target_steps": t,
            "text": f"step offset {offset} detected from parameter statistics (target step = baseline step + "
                    f"{offset}; baseline steps {format_ranges(b)}, target steps {format_ranges(t)})"}


def _aligned(alignment: Any) -> list[dict[str, Any]]:
    """One assumption per way of pairing nodes that is not by name nor the user's."""
    if alignment is None or getattr(alignment, "identical", True):
        return []
    out = []
    for how, what in _BY.items():
        pairs = [p for p in alignment.nodes if p.how == how]
        if not pairs:
            continue
        mods = sum(1 for p in alignment.modules if p.how == how)
        ex = [{"baseline": p.baseline, "target": p.target} for p in pairs[:3]]
        out.append({"kind": f"aligned_by_{how}", "count": len(pairs), "modules": mods, "examples": ex,
                    "text": f"{len(pairs)} node(s) of differently named runs paired by {what}"
                            + (f" ({mods} module pair(s) too)" if mods else "")
                            + f", e.g. {ex[0]['baseline']} -> {ex[0]['target']}"})
    return out


def _offset(options: Any, ctx: Any) -> list[dict[str, Any]]:
    """The detected step offset of a pair (none when it was given, or both runs hold the same steps)."""
    given = getattr(options, "step_offset", None)
    if ctx.baseline is None or ctx.step_offset is None or (isinstance(given, int) and not isinstance(given, bool)):
        return []
    rb = ctx.raw_baseline if ctx.raw_baseline is not None else ctx.baseline
    rt = ctx.raw_target if ctx.raw_target is not None else ctx.target
    b, t = [int(s) for s in rb["step"].values], [int(s) for s in rt["step"].values]
    if given is None and sorted(b) == sorted(t):
        return []
    return [step_offset(int(ctx.step_offset), b, t)]


def collect(ctx: Any, options: Any, layouts: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every assumption of one pipeline run: the inferred *layouts*, the detected step offset, the alignment.

    *ctx* is the diagnoses' :class:`~precnb.analysis.registry.Context` (its resolved step offset and
    alignment), *options* the pipeline's :class:`~precnb.pipeline.Options` (what the user gave).
    """
    out: list[dict[str, Any]] = []
    for a in layouts:
        if a not in out:
            out.append(dict(a))
    return out + _offset(options, ctx) + _aligned(ctx.alignment)


def attach(findings: Sequence[Any], assumptions: Sequence[dict[str, Any]]) -> None:
    """Give every finding the triage's assumptions (its own copy of the list)."""
    for f in findings:
        f.assumptions = [dict(a) for a in assumptions]

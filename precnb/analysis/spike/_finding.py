"""``loss_spike``: the spike step, its causes ranked, lead indicators and the dump that confirms it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.analysis.findings import Finding
from precnb.analysis.spike._causes import data_causes, hardware_causes, numerics_causes, optimizer_causes
from precnb.analysis.spike._records import View
from precnb.analysis.spike._rule import LossSpikeRule, first_departures
from precnb.analysis.spike._series import LossSeries, gather_series

__all__ = ["detect", "loss_spike"]

_PUBLIC = ("cause", "certain", "text", "step", "rank", "node", "tensor", "module")


def detect(series: LossSeries, rule: LossSpikeRule | None = None) -> dict[str, Any] | None:
    """The spike of *series*: the earliest departing step over the ranks' and the run's series (None: no spike).

    Returns
    -------
    dict or None
        ``step``; ``ranks`` (the ranks whose own series departs at that step); ``all_ranks``;
        ``by_series`` (``"rank{R}"`` / ``"all"`` → the departure, see
        :func:`~precnb.analysis.spike._rule.first_departure`); ``rule`` (in words).
    """
    rule = rule or LossSpikeRule()
    found: dict[str, dict[str, Any]] = {}
    cols = np.column_stack([np.asarray(series.values, dtype=float)[:, :len(series.ranks)],
                            np.asarray(series.total, dtype=float)])
    deps = first_departures(cols, series.steps, rule, proxy=series.proxy)  # every rank's, then the run's
    for r, d in zip(series.ranks, deps[:-1], strict=True):
        if d is not None:
            found[f"rank{r}"] = d
    if deps[-1] is not None:
        found["all"] = deps[-1]
    if not found:
        return None
    step = min(d["step"] for d in found.values())
    ranks = [r for r in series.ranks if found.get(f"rank{r}", {}).get("step") == step]
    return {"step": step, "ranks": ranks, "all_ranks": list(series.ranks),
            "by_series": {k: v for k, v in found.items() if v["step"] == step},
            "later": {k: v["step"] for k, v in found.items() if v["step"] != step},
            "rule": rule.describe(proxy=series.proxy)}


def _views(dump: xr.Dataset | None, monitor: xr.Dataset | None) -> list[View]:
    out = []
    if dump is not None:
        out.append(View(dump, "dump"))
    if monitor is not None:
        out.append(View(monitor, "monitor"))
    return out


def _order(cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Most likely first: certain before possible, then the stronger departure, then the earlier origin."""
    return sorted(cands, key=lambda c: (not c["certain"], -round(c["strength"], 3), c["step"],
                                        c.get("seq", math.inf)))


def _lead_indicators(views: list[View], spike_step: int, ranks: list[int] | None) -> dict[str, Any] | None:
    """Modules ranked by how many steps before the spike their statistics left their history (trend breaks)."""
    from precnb.analysis.anomalies.trends import bookkeeping_nodes, drift_table

    rows: list[dict[str, Any]] = []
    for v in views:
        ds = v.ds
        if ds.sizes["step"] < 4:
            continue
        table = drift_table(ds, skip=bookkeeping_nodes(ds))
        if not len(table):
            continue
        for r in table.to_dict("records"):
            if r["step"] < spike_step:
                rows.append({**r, "source": v.name})
    if not rows:
        return None
    seen: set[tuple[str, int]] = set()
    modules = []
    for r in sorted(rows, key=lambda r: (r["step"], r["source"] != "monitor", r["seq"])):
        key = (r["module"] or r["node"], r["rank"])
        if key in seen:
            continue
        seen.add(key)
        modules.append({"module": r["module"] or None, "node": r["node"], "tensor": r["tensor"], "stat": r["stat"],
                        "rank": int(r["rank"]), "onset_step": int(r["step"]), "direction": r["direction"],
                        "reference": float(r["reference"]), "last_value": float(r["last_value"]),
                        "last_step": int(r["last_step"]), "lead_steps": int(spike_step - r["step"]),
                        "source": r["source"]})
    modules.sort(key=lambda m: (-m["lead_steps"], m["module"] is None))
    return {"reference_change": {"loss": spike_step}, "first_reference_change": spike_step, "modules": modules[:50]}


def loss_spike(
    dump: xr.Dataset | None = None,
    *,
    monitor: xr.Dataset | None = None,
    loss: pd.DataFrame | None = None,
    loss_source: str = "loss log",
    rule: LossSpikeRule | None = None,
    limit: int = 50,
) -> Finding:
    """Why did the loss spike: the step, the origin (rank, node / tensor / module) and the cause, ranked.

    Parameters
    ----------
    dump : xarray.Dataset, optional
        An msprobe dump (statistics of the steps around the spike suffice). A monitor output
        passed here is taken as *monitor*.
    monitor : xarray.Dataset, optional
        msprobe TrainerMon output (every step: activations, gradients before / after the reduce,
        parameters before / after the optimizer step, optimizer moments).
    loss : pandas.DataFrame, optional
        A loss log: columns ``step``, ``loss`` and optionally ``rank`` (:func:`precnb.io.read_loss_log`).
    loss_source : str
        Where *loss* was read (shown in the finding).
    rule : LossSpikeRule, optional
        The spike test (see :mod:`precnb.analysis.spike`).
    limit : int
        Most further candidates listed as ``suspects``.

    Returns
    -------
    Finding
        Kind ``loss_spike`` (``step``: the first departing step; ``rank``: the origin rank, None
        when every rank spikes together; ``node`` / ``tensor`` / ``module`` of the origin;
        ``causes`` most likely first; ``values["origin"]``, ``evidence["loss"]``,
        ``evidence["trend"]`` lead indicators) or kind ``none``.

    Examples
    --------
    >>> import precnb, pandas as pd
    >>> run = precnb.sample_path("spike_data")  # doctest: +SKIP
    >>> f = loss_spike(precnb.open_run(run / "dump"), monitor=precnb.open_run(run / "monitor_output"),
    ...                loss=pd.read_csv(run / "loss_log.csv"))  # doctest: +SKIP
    >>> f.step, f.rank, f.node, f.causes[0]["cause"]  # doctest: +SKIP
    (6, 1, 'Functional.embedding.0.forward', 'data')
    """
    rule = rule or LossSpikeRule()
    if dump is not None and monitor is None and dump.sizes.get("tensor", 0) and bool(
            np.all(np.asarray(dump["kind"].values) == "monitor")):
        dump, monitor = None, dump
    series = gather_series(dump, monitor, loss, loss_source)
    stats: dict[str, Any] = {}
    if series is None:
        return Finding(kind="none", reason="no loss recorded (no loss op in the dump, no loss log, no gradient norm "
                                           "in the monitor): give the loss log (--loss)", stats=stats)
    stats = {"steps": [int(s) for s in series.steps], "ranks": list(series.ranks), "signal": series.signal,
             "source": series.source}
    spike = detect(series, rule)
    if spike is None:
        if series.proxy:
            reason = (f"no loss recorded, and the total gradient norm that stands in for it ({series.source}) shows no "
                      f"jump of more than {rule.jump:g}x over steps {_span(series.steps)}: give the loss log (--loss) "
                      "to judge the loss itself")
        else:
            reason = (f"no loss spike: the loss ({series.source}) never departs from its own recent history over steps "
                      f"{_span(series.steps)}")
        if len(series.steps) < rule.min_history + 2 and not series.proxy:
            reason += (f" (only {len(series.steps)} steps: below {rule.jump:g}x a spike cannot be told from noise; "
                       "give the loss log of the whole run with --loss)")
        return Finding(kind="none", reason=reason, stats=stats, evidence={"rule": rule.describe(proxy=series.proxy)},
                       hints=list(series.notes))
    sp = int(spike["step"])
    views = _views(dump, monitor)
    grad_steps = [sp - 2, sp - 1] + ([sp] if series.proxy else [])
    from precnb.analysis.spike._series import dump_loss_label

    loss_label = dump_loss_label(dump) if dump is not None else None
    cands = (data_causes(views, spike, z=rule.z) if not series.proxy else [])
    cands += hardware_causes(views, grad_steps)
    cands += optimizer_causes(views, [sp - 2, sp - 1], sp)
    cands += numerics_causes(views, [sp - 1, sp], sp, loss_label)
    ranked = _order(cands)
    return _finding(series, spike, ranked, views, rule, stats, limit)


def _span(steps: np.ndarray) -> str:
    from precnb.analysis.summary import format_ranges

    return format_ranges([int(s) for s in steps])


def _finding(series: LossSeries, spike: dict[str, Any], ranked: list[dict[str, Any]], views: list[View],
             rule: LossSpikeRule, stats: dict[str, Any], limit: int) -> Finding:
    sp = int(spike["step"])
    what = "gradient norm" if series.proxy else "loss"
    deps = spike["by_series"]
    ranks = spike["ranks"]
    local = bool(ranks) and len(ranks) < len(spike["all_ranks"])
    where = (f"rank(s) {', '.join(map(str, ranks))} only" if local else
             "every rank" if ranks else "the run's loss")
    best = max(deps.values(), key=lambda d: d["ratio"])
    head = (f"the {what} spikes at step {sp} on {where} ({best['previous']:.4g} → {best['value']:.4g}, "
            f"{best['ratio']:.3g}x)")
    first = ranked[0] if ranked else None
    origin_rank = first["rank"] if first else (ranks[0] if local and len(ranks) == 1 else None)
    if first is not None:
        reason = f"{head}: {first['cause']}{'' if first['certain'] else ' (possible)'} — {first['text']}"
    else:
        reason = (f"{head}: no cause found in the records (no batch input stands out, no gradient departs across "
                  "ranks, no update jumps, no overflow); the plan dumps the spike step")
    causes = [{k: c.get(k) for k in _PUBLIC} | {"series": c["series"]} for c in ranked]
    values: dict[str, Any] = {
        "spike": {"step": sp, "signal": series.signal, "source": series.source, "ranks": ranks,
                  "previous": best["previous"], "value": best["value"], "ratio": best["ratio"], "z": best["z"],
                  "test": best["test"]},
    }
    if first is not None:
        values["origin"] = {k: first.get(k) for k in ("step", "rank", "node", "tensor", "module", "cause")}
        for k in ("parameter", "parameters", "arguments", "values", "micro_batch", "scale"):
            if first.get(k) not in (None, [], {}):
                values["origin"][k] = first[k]
    evidence: dict[str, Any] = {"loss": series.around(sp), "rule": spike["rule"],
                                "departures": [{"series": k, **d} for k, d in deps.items()],
                                "later_departures": spike["later"],
                                "series": [s for c in ranked[:3] for s in c["series"]]}
    trend = _lead_indicators(views, sp, series.ranks)
    if trend is not None:
        evidence["trend"] = trend
    hints = list(series.notes)
    if trend is not None and trend["modules"]:
        m = trend["modules"][0]
        hints.append(f"lead indicator: {m['module'] or m['node']} {m['stat']} {m['direction']} from step "
                     f"{m['onset_step']}, {m['lead_steps']} step(s) before the spike")
    if not series.ranks:
        hints.append("the loss log has no rank column and the dump no loss op: the rank that spiked first is not known")
    suspects = [{"step": c["step"], "rank": c["rank"], "node": c["node"], "tensor": c["tensor"],
                 "why": f"{c['cause']}{'' if c['certain'] else '?'}: {c['text']}"} for c in ranked[1:limit + 1]]
    f = Finding(kind="loss_spike", reason=reason, step=sp, rank=origin_rank,
                node=first["node"] if first else None, tensor=first["tensor"] if first else None,
                module=first["module"] if first else None, values=values, hints=hints, suspects=suspects,
                evidence=evidence, stats=stats, causes=causes)
    return f

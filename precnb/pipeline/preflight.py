"""``precnb.preflight``: the pre-flight checks through the one pipeline, as the JSON-able check list.

The checks themselves are :func:`precnb.analysis.preflight.preflight`; they run as the
diagnosis of kind ``preflight`` (:mod:`precnb.analysis.diagnoses`), so ``precnb.diagnose`` and
every front end see the same checks. :func:`with_preflight` (in :mod:`precnb.pipeline.stepwise_read`, which
the pipeline imports without this module) joins the pre-flight result of a two-step read with a
first-divergence search that read the runs step by step.
"""

from __future__ import annotations

from typing import Any

from precnb.pipeline.stepwise_read import note_later, with_preflight

__all__ = ["PREFLIGHT_SCHEMA", "checklist", "note_later", "preflight", "with_preflight"]

PREFLIGHT_SCHEMA = "precnb.preflight/1"


def preflight(base: Any, target: Any = None, **options: Any) -> dict[str, Any]:
    """Pre-flight checks of one run (*base*) or of *target* against *base*, before any layer-by-layer compare.

    Parameters
    ----------
    base : path or xarray.Dataset
        The baseline run, or the one run checked (a dump, a msprobe ``config_check`` pack, ...).
    target : path or xarray.Dataset, optional
        The run compared with *base*.
    **options
        Pipeline options (:class:`precnb.Options`): ``layout`` / ``target_layout`` (which ranks
        share a batch by design: TP, CP, PP groups; only distinct DP replicas must read distinct
        data), ``baseline_layout``, ``step_offset``, ``steps``, ``ranks``, ``format``, ...

    Returns
    -------
    dict
        ``{"schema": "precnb.preflight/1", "status": worst status, "baseline": name | None,
        "target": name, "checks": [{"name", "title", "status", "message", "confidence", "basis",
        "details"}, ...]}`` (strict JSON values); see :mod:`precnb.analysis.preflight`.

    Raises
    ------
    NotADumpError
        When an input holds nothing readable.

    Examples
    --------
    >>> import precnb
    >>> out = precnb.preflight(precnb.sample_path("preflight/same_batch"))  # doctest: +SKIP
    >>> [c["status"] for c in out["checks"] if c["name"] == "dp_data"]  # doctest: +SKIP
    ['fail']
    """
    from precnb.pipeline.run import diagnose

    kw = {k: v for k, v in options.items() if k != "kinds"}
    triage = diagnose(base, kinds=["preflight"], **kw) if target is None else diagnose(
        target, baseline=base, kinds=["preflight"], **kw)
    return checklist(triage)


def checklist(triage: Any) -> dict[str, Any]:
    """The :func:`preflight` dict of a :class:`~precnb.Triage` that ran the pre-flight checks."""
    from precnb.analysis.findings import jsonable

    f = triage.result("preflight")
    if f is None:
        raise ValueError("the pre-flight checks did not run in this triage (kinds without 'preflight')")
    checks = list(f.evidence.get("checks", []))
    return jsonable({"schema": PREFLIGHT_SCHEMA, "status": f.stats.get("status"),
                     "baseline": triage.names[0] if triage.paired else None, "target": triage.names[1],
                     "checks": checks})

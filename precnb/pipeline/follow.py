"""``precnb devices``: each job's replica departures, followed to hosts and devices (issue 28).

The per-job diagnosis is :func:`precnb.diagnose` (the replica check with the job's rank table); the
verdicts are :func:`precnb.analysis.replicas.devices.device_verdicts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from precnb.pipeline.run import diagnose

__all__ = ["follow_devices"]


def follow_devices(runs: Mapping[str, Any], tables: Mapping[str, Any], *, layout: Any,
                   baseline: Any = None, **options: Any) -> dict[str, Any]:
    """``precnb devices``: each job's replica departures, followed to hosts and devices across jobs.

    Parameters
    ----------
    runs : mapping name -> run
        The jobs (paths or datasets), by display name.
    tables : mapping name -> rank table
        Each job's rank table (path or mapping; see :func:`resolve_rank_table`).
    layout : str, mapping or Layout
        The parallel layout of every job (``"tp=2,dp=2"``).
    baseline : path or xarray.Dataset, optional
        A clean run of the same training: decides two-replica departures.
    **options
        Further :class:`~precnb.pipeline.Options` (``replica_rtol``, ``rng_regions``, ``workers``, ...).

    Returns
    -------
    dict
        ``{"devices": [...]}`` (:func:`precnb.analysis.replicas.devices.device_verdicts`), and the per-job findings
        under ``"findings"`` (not part of the printed shape).

    Examples
    --------
    >>> import precnb
    >>> root = precnb.sample_path("sdc")
    >>> out = follow_devices({j: root / j for j in ("job1", "job2")},
    ...                      {j: root / "rank_tables" / f"{j}.csv" for j in ("job1", "job2")},
    ...                      layout="tp=2,dp=2", workers=1)
    >>> out["devices"][0]["host"], out["devices"][0]["device"], out["devices"][0]["verdict"]
    ('10.0.0.1', '1', 'suspect')
    """
    from precnb.analysis.replicas.devices import device_verdicts

    events: dict[str, list[dict[str, Any]]] = {}
    placed: dict[str, dict[int, dict[str, str]]] = {}
    findings: dict[str, Any] = {}
    notes: list[str] = []  # a rank table's rows for ranks its run does not have (#49)
    for name, run in runs.items():
        t = diagnose(run, kinds=["replica_mismatch"], target_layout=layout, rank_table=tables[name],
                     replica_baseline=baseline, **options)
        f = t.result("replica_mismatch") or t.finding
        findings[name] = f
        events[name] = list(f.evidence.get("departures", [])) if f is not None and f.found else []
        assert t.rank_table is not None
        placed[name] = t.rank_table
        notes += [n for n in t.notes if n.startswith("rank table ") and n not in notes]
    return {"devices": device_verdicts(events, placed), "findings": findings, "notes": notes}

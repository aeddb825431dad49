"""Rank tables in the pipeline: every finding that names a rank also names its host and device.

:func:`resolve_rank_table` turns the ``rank_table`` option (a path to an HCCL ``rank_table_file``
JSON or a ``rank,host,device`` CSV, or a mapping) into ``{rank: {"host", "device"}}`` and checks
that it places every rank of the run; :func:`attach_devices` writes ``device`` on each finding,
on its suspects and on every entry of its replica departures (``evidence["departures"]``) that
names a rank.

Two public verbs run the pipeline for one purpose and live here too: :func:`follow_devices` (``precnb devices``:
each job's replica departures, followed to hosts and devices across jobs, issue 28; the per-job diagnosis is
:func:`precnb.diagnose`, the verdicts :func:`precnb.analysis.replicas.devices.device_verdicts`) and
:func:`preflight` (``precnb.preflight``: the pre-flight checks through the one pipeline, as the JSON-able check
list; the checks themselves are :func:`precnb.analysis.preflight.preflight`, run as the diagnosis of kind
``preflight``, so ``precnb.diagnose`` and every front end see the same checks).

Examples
--------
>>> from precnb.analysis.findings import Finding
>>> f = Finding(kind="nan_origin", reason="r", rank=1, suspects=[{"rank": 0, "step": 2}])
>>> attach_devices([f], {0: {"host": "h", "device": "0"}, 1: {"host": "h", "device": "1"}})
>>> f.device, f.suspects[0]["device"]
({'host': 'h', 'device': '1'}, {'host': 'h', 'device': '0'})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import xarray as xr

__all__ = ["PREFLIGHT_SCHEMA", "attach_devices", "checklist", "device_labels", "follow_devices", "preflight",
           "replica_inputs", "resolve_rank_table"]

PREFLIGHT_SCHEMA = "precnb.preflight/1"

#: evidence entries that list ranks (replica departures, their candidates and consequences)
_EVIDENCE_KEYS = ("departures", "departure", "candidates")


def resolve_rank_table(value: Any, ds: xr.Dataset | None = None, notes: list[str] | None = None
                       ) -> dict[int, dict[str, str]] | None:
    """The rank table of the ``rank_table`` option (None: none given), checked against *ds*'s ranks.

    Rows for ranks *ds* does not have are dropped and said in *notes* (one note naming the table).

    Without the option, a table stored on the run (``ds.attrs["rank_table"]``, written by
    ``precnb.open_run(..., rank_table=...)``) is used.

    Raises
    ------
    precnb.io.rank_table.RankTableError
        A table that cannot be read, or that does not place a rank of the run.
    """
    from precnb.io.rank_table import check_covers, normalise_table, within_run

    name = str(value) if value is not None and not isinstance(value, Mapping) else "rank table"
    if value is None and ds is not None and ds.attrs.get("rank_table"):
        import json

        value = {int(k): v for k, v in json.loads(ds.attrs["rank_table"]).items()}
        name = str(ds.attrs.get("rank_table_source") or "the run's rank table")
    if value is None:
        return None
    table = normalise_table(value, name=name)
    if ds is not None and "rank" in ds.dims:
        check_covers(table, (int(r) for r in ds["rank"].values), name=name)
        # never a device the run does not have; the rows left out are said (#49)
        table = within_run(table, (int(r) for r in ds["rank"].values), notes=notes, name=name)
    return table


def _walk(obj: Any, table: Mapping[int, dict[str, str]]) -> None:
    if isinstance(obj, dict):
        r = obj.get("rank")
        if isinstance(r, int) and not isinstance(r, bool) and "device" not in obj and r in table:
            obj["device"] = dict(table[r])
        for v in obj.values():
            if isinstance(v, (dict, list)):
                _walk(v, table)
    elif isinstance(obj, list):
        for v in obj:
            _walk(v, table)


def attach_devices(findings: Iterable[Any], table: Mapping[int, dict[str, str]] | None) -> None:
    """Name the host and device beside every rank of *findings* (changed in place; no-op without a table)."""
    if not table:
        return
    for f in findings:
        if f.rank is not None and int(f.rank) in table:
            f.device = dict(table[int(f.rank)])
        _walk(f.suspects, table)
        _walk(f.crc_only, table)
        for key in _EVIDENCE_KEYS:
            if key in f.evidence:
                _walk(f.evidence[key], table)


def replica_inputs(tsrc: Any, opts: Any, raw_t: xr.Dataset, *, loaded: Any, common: dict[str, Any]) -> dict[str, Any]:
    """What the replica diagnosis reads besides the run: the dump's node records and the clean baseline run.

    ``node_records(step, rank, node)`` reads one record of the target's dump (its scalar arguments) when
    the target was given as a path or read from one; ``replica_baseline`` is the ``replica_baseline`` option
    opened with the target's steps.
    """
    out: dict[str, Any] = {}
    if getattr(tsrc, "records_path", None):
        from precnb.io.api import node_records

        fmt = opts.format

        def records(step: int, rank: int, node: str) -> Any:
            where, reader = tsrc.resolved(fmt)  # the reader asked once per path (Source.resolved)
            return node_records(where, step, rank, [node], format=reader).get(node)

        out["node_records"] = records
    if opts.replica_baseline is not None:
        from precnb.pipeline.sources import Source, open_source

        steps = [int(s) for s in raw_t["step"].values]
        out["replica_baseline"] = open_source(Source(opts.replica_baseline, "baseline"), loaded=loaded, steps=steps,
                                              **common)
    return out


def device_labels(triage: Any) -> dict[int, str]:
    """``{rank: "host:device"}`` of a triage's rank table, the replica departure's devices marked.

    The wrong side of the first departure (decided by a clean run or the majority) is marked
    ``(suspect)``, the two sides of an undecided pair ``(candidate)``. ``{}`` without a rank table.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from precnb.analysis.findings import Finding
    >>> f = Finding(kind="replica_mismatch", reason="r", rank=1,
    ...             evidence={"candidates": [{"rank": 1, "wrong_side": True}]})
    >>> t = SimpleNamespace(rank_table={0: {"host": "h", "device": "0"}, 1: {"host": "h", "device": "1"}},
    ...                     result=lambda kind: f)
    >>> device_labels(t)
    {0: 'h:0', 1: 'h:1 (suspect)'}
    """
    table = getattr(triage, "rank_table", None)
    if not table:
        return {}
    out = {int(r): f"{d['host']}:{d['device']}" for r, d in table.items()}
    f = triage.result("replica_mismatch")
    for c in ((f.evidence.get("candidates") or []) if f is not None and f.found else []):
        r = int(c["rank"])
        if r in out:
            out[r] += " (suspect)" if c.get("wrong_side") else " (candidate)"
    return out


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
    from precnb.pipeline.run import diagnose

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

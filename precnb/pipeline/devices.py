"""Rank tables in the pipeline: every finding that names a rank also names its host and device.

:func:`resolve_rank_table` turns the ``rank_table`` option (a path to an HCCL ``rank_table_file``
JSON or a ``rank,host,device`` CSV, or a mapping) into ``{rank: {"host", "device"}}`` and checks
that it places every rank of the run; :func:`attach_devices` writes ``device`` on each finding,
on its suspects and on every entry of its replica departures (``evidence["departures"]``) that
names a rank.

``precnb devices`` (:func:`precnb.pipeline.run.follow_devices`) follows each job's replica departures to hosts and
devices across jobs with these tables.

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

__all__ = ["attach_devices", "device_labels", "replica_inputs", "resolve_rank_table"]

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


def replica_inputs(tsrc: Any, opts: Any, raw_t: xr.Dataset, *, loaded: Any, common: dict[str, Any],
                   baseline: Any = None) -> dict[str, Any]:
    """What the replica diagnosis reads besides the run: the dump's node records and the clean baseline run.

    ``node_records(step, rank, node)`` reads one record of the target's dump (its scalar arguments) when
    the target was given as a path or read from one; ``replica_baseline`` is the clean run opened with the
    target's steps: the ``replica_baseline`` option, else the triage's *baseline* when the checks were asked for
    by name (``diagnose(run, baseline=clean, kinds=["replica_mismatch"])`` is ``precnb replicas RUN --baseline
    CLEAN``; a full triage of a pair keeps the majority rule).
    """
    out: dict[str, Any] = {}
    if getattr(tsrc, "records_path", None):
        from precnb.io.api import node_records

        fmt = opts.format

        def records(step: int, rank: int, node: str) -> Any:
            where, reader = tsrc.resolved(fmt)  # the reader asked once per path (Source.resolved)
            return node_records(where, step, rank, [node], format=reader).get(node)

        records.key = (str(tsrc.records_path), repr(fmt))  # type: ignore[attr-defined]  # what it reads (reuse)
        out["node_records"] = records
    from precnb.pipeline.sources import Source, open_source

    clean = Source(opts.replica_baseline, "baseline") if opts.replica_baseline is not None else (
        baseline if isinstance(baseline, Source) and opts.kinds is not None else None)
    if clean is not None:
        steps = [int(s) for s in raw_t["step"].values]
        out["replica_baseline"] = open_source(clean, loaded=loaded, steps=steps, **common)
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
    from precnb.analysis.diagnoses import REPLICAS

    f = triage.result(REPLICAS)
    for c in ((f.evidence.get("candidates") or []) if f is not None and f.found else []):
        r = int(c["rank"])
        if r in out:
            out[r] += " (suspect)" if c.get("wrong_side") else " (candidate)"
    return out

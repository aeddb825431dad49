"""The scalar arguments of a divergence's node, read from both dumps when the finding is made.

The statistics cannot show that an op ran with another ``eps`` or scale; its record in
``dump.json`` can. For a first divergence whose node is in both runs, the pipeline reads that
node's record at the finding's (step, rank) from each dump (:func:`precnb.io.node_records`,
only those records are decoded) and, when scalar arguments differ
(:func:`precnb.analysis.divergence.scalars.differing_arguments`), adds a certain cause and says so in
the reason. Inputs given as datasets read from nowhere known (no files) are left as they are.
"""

from __future__ import annotations

from typing import Any

from precnb.pipeline.sources import Source

__all__ = ["attach_scalar_arguments"]

_COMPUTED = "computed differently here"


def _records(src: Source, step: int, rank: int, node: str, fmt: str | None) -> dict[str, Any] | None:
    path = src.records_path
    if path is None:
        return None
    from precnb.io.api import node_records

    try:
        return node_records(path, step, rank, [node], format=fmt).get(node)
    except Exception:  # evidence is optional: the finding stands without it
        return None


def attach_scalar_arguments(findings: list[Any], tsrc: Source, bsrc: Source | None, *,
                            names: tuple[str, str], format: str | None = None) -> None:
    """Add a ``scalar_argument`` cause to each first divergence whose node ran with other constants.

    Parameters
    ----------
    findings : list of Finding
        Changed in place.
    tsrc, bsrc : Source
        The target and baseline as given (paths are read, and so are the paths datasets were read
        from, :class:`~precnb.pipeline.inputs.ReadRun`; other datasets are skipped).
    names : (str, str)
        The (baseline, target) display names.
    format : str, optional
        The forced input format.
    """
    if bsrc is None or tsrc.records_path is None or bsrc.records_path is None:
        return
    from precnb.analysis.divergence.scalars import argument_cause, differing_arguments, format_argument
    from precnb.analysis.registry import lookup

    for f in findings:
        if getattr(lookup(f.kind), "mode", None) != "pair" or not f.node or f.step is None or f.rank is None:
            continue  # a finding of a pair diagnosis (the first divergence) naming one record
        if f.evidence.get("only_in"):
            continue  # a node one run does not have has nothing to compare
        b_node = (f.baseline or {}).get("node") or f.node
        t_step = int(f.values.get("target_step", f.step)) if isinstance(f.values, dict) else int(f.step)
        rb = _records(bsrc, int(f.step), int(f.rank), b_node, format)
        dump = f.evidence.get("dump") if isinstance(f.evidence.get("dump"), dict) else None
        # a merged target's record is in the dump under its own rank(s) and local name
        where = [(int(r), str(dump["node"])) for r in dump["ranks"]] if dump else [(int(f.rank), f.node)]
        for rank, node in where:
            rt = _records(tsrc, t_step, rank, node, format)
            if rt is None or rb is None:
                continue
            diffs = differing_arguments(rt, rb)
            if not diffs:
                continue
            cause = argument_cause(node, diffs, baseline_node=b_node, names=names)
            if dump:
                cause["rank"] = rank
                dump["rank"] = rank
            f.causes.insert(0, cause)
            d = diffs[0]
            if _COMPUTED in f.reason:
                on = f" on rank {rank} ({node})" if dump else ""
                said = (f"computed with a different scalar argument{on} ({d['argument']} = "
                        f"{format_argument(d['target'])} here, {format_argument(d['baseline'])} in {names[0]})")
                f.reason = f.reason.replace(_COMPUTED, said)
            break

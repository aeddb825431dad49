"""Rerunning the explorer's triage: the runs as given, and :func:`precnb.diagnose` with changed options."""

from __future__ import annotations

from typing import Any

from precnb.widgets._inputs import Runs, runs_of

__all__ = ["input_paths", "rerun_triage", "sources_of"]


def sources_of(runs: Runs, triage: Any) -> dict[str, Any]:
    """The runs as given (before merging), by name: what a rerun starts from.

    Runs read from a path are that dataset and that path (:class:`precnb.pipeline.ReadRun`): a
    rerun does not read the dumps again, and still reads what only they hold (node records).
    """
    if triage is not None and triage.raw_target is not None and len(runs.names) <= 2:
        from precnb.pipeline import ReadRun

        b, t = (str(x) for x in triage.names)
        pb, pt = getattr(triage, "source_paths", (None, None))

        def read(ds: Any, path: str | None) -> Any:
            return ReadRun(ds, path) if path else ds

        if triage.raw_baseline is None:
            return {t or "run": read(triage.raw_target, pt)}
        if b == t:
            b, t = f"{b} (baseline)", f"{t} (target)"
        return {b: read(triage.raw_baseline, pb), t: read(triage.raw_target, pt)}
    if runs.names:
        return {n: runs.run(n) for n in runs.names}
    return {"run": runs.ds}


def input_paths(runs: Runs, triage: Any, sources: dict[str, Any]) -> list[str]:
    """Every path the explored runs were read from: what a write (report, mapping file) must stay out of.

    The paths given (:func:`sources_of`), and those the datasets and the triage recorded
    (:func:`precnb._write.dataset_inputs`).
    """
    import os

    from precnb._write import dataset_inputs

    out: list[str] = []
    for src in sources.values():
        path = getattr(src, "path", None)  # a ReadRun: the dataset and where it was read from
        if path:
            out.append(os.fspath(path))
            src = src.ds
        out += [os.fspath(src)] if isinstance(src, (str, os.PathLike)) else dataset_inputs(src)
    out += dataset_inputs(triage) + dataset_inputs(runs.ds)
    return list(dict.fromkeys(out))


def rerun_triage(sources: dict[str, Any], triage: Any, *, target: str | None = None, baseline: Any = "keep",
                 **options: Any) -> tuple[Runs, Any]:
    """(runs, triage) of :func:`precnb.diagnose` on two of *sources* with *triage*'s options changed.

    *target* / *baseline* name sources (default: *triage*'s; ``baseline=None``: the target alone);
    ``kinds`` is reset to every diagnosis.

    Raises
    ------
    ValueError
        For a name that is not one of *sources*.
    """
    from precnb.pipeline import Options, diagnose

    src = sources
    names = list(src)
    cur_b, cur_t = (str(x) for x in triage.names) if triage is not None else ("", names[-1])
    target = target or (cur_t if cur_t in src else names[-1])
    if baseline == "keep":
        baseline = cur_b if cur_b in src and cur_b != target else None
    if baseline is not None and baseline not in src:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {names}")
    if target not in src:
        raise ValueError(f"target {target!r} is not one of the runs {names}")
    opts = (triage.options if triage is not None else Options()).with_(kinds=None, **options)
    if baseline is None and opts.baseline_layout is not None:
        opts = opts.with_(baseline_layout=None)
    t = diagnose({baseline: src[baseline], target: src[target]} if baseline is not None else src[target],
                 options=opts)
    return runs_of(t), t

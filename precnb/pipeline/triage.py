"""``precnb.diagnose``: the one path from inputs and options to ordered findings.

Load → merge shards (layouts) → align names → resolve the step offset → run every registered
diagnosis that applies (:mod:`precnb.analysis.registry`) → order the findings. The command
line, the report, the explorer, the notebook templates and ``ds.prec`` are thin front ends
over it, so the same input and options always give the same first finding.
"""

from __future__ import annotations

from typing import Any

from precnb._args import baseline_keyword
from precnb.pipeline.inputs import normalize
from precnb.pipeline.layout_merge import merge_layouts
from precnb.pipeline.options import Options
from precnb.pipeline.prepare import nothing_compared_first, resolve_layout
from precnb.pipeline.result import TRIAGE_SCHEMA, Triage, shared_comparison
from precnb.pipeline.sources import ReadRun

__all__ = ["TRIAGE_SCHEMA", "ReadRun", "Triage", "diagnose", "merge_layouts", "nothing_compared_first",
           "resolve_layout", "shared_comparison"]

@baseline_keyword()
def diagnose(
    target: Any,
    *,
    baseline: Any = None,
    options: Options | None = None,
    **kw: Any,
) -> Triage:
    """Diagnose one run, or a target against its baseline: every applicable diagnosis, in order.

    Parameters
    ----------
    target : path, xarray.Dataset or mapping
        The run diagnosed: a dump root / step / rank folder, monitor output, kernel dump, compare
        CSV or zarr store; an opened dataset; a dataset holding two runs (``run`` dim; the first is
        the baseline); or ``{"gpu": a, "npu": b}`` (first = baseline, last = target).
    baseline : path, xarray.Dataset or str, optional
        The run it is compared with (or, with a combined dataset, the name of one of its runs).
        Keyword-only (``diagnose(target, baseline=...)``; ``precnb diff BASE TARGET`` puts it
        first): a second positional run is a ``TypeError``, never a silent swap.
    options : Options, optional
        All options at once; or give them as keyword arguments (see :class:`Options`):
        ``target_layout`` (alias ``layout``), ``baseline_layout``, ``layouts`` (by run name), ``step_offset``,
        ``tolerance``, ``reference``, ``mapping``, ``steps``, ``ranks``, ``kinds``, ``crc``, ``format``,
        ``workers``, ``client``, ``progress``, ``spike_z``, ``spike_ratio``, ``spike_stats``,
        ``limit``, ``replica_rtol``, ``monitor``, ``loss``.

    Returns
    -------
    Triage
        ``.finding`` is the most important finding; ``.findings`` all of them.

    Raises
    ------
    NotADumpError
        When an input holds nothing readable.
    ValueError
        When the options do not fit the inputs (a layout that does not match the ranks, two runs
        that share no step, an unknown diagnosis kind).

    Examples
    --------
    >>> import precnb
    >>> t = precnb.diagnose(precnb.sample_path("dp_nan"))  # doctest: +SKIP
    >>> t.finding.kind, t.finding.step, t.finding.rank  # doctest: +SKIP
    ('nan_origin', 1, 1)
    """
    from precnb.pipeline.plan import make_plan
    from precnb.pipeline.run import run

    opts = options.with_(**kw) if options is not None and kw else (options or Options.from_kwargs(**kw))
    inputs = normalize(target, baseline, layouts=opts.layouts, target_layout=opts.target_layout,
                       baseline_layout=opts.baseline_layout, mapping=opts.mapping)  # the one input model
    return run(make_plan(inputs, opts))

"""What a triage does, decided once before anything is read: :func:`make_plan` → :class:`Plan`.

The sources and their layouts by role, the diagnoses asked for, the tolerance, and the reading strategy (the
whole runs, or step batch by step batch when one search asks for it and the others need the first steps only).
:func:`precnb.pipeline.run.run` carries a plan out; :func:`precnb.diagnose` is ``run(make_plan(normalize(…)))``.

Examples
--------
>>> import precnb
>>> from precnb.pipeline.inputs import normalize
>>> plan = make_plan(normalize(precnb.sample_path("dp_nan")), Options(kinds=["nan_origin"]))
>>> plan.baseline is None, plan.stepwise, [d.kind for d in plan.diagnoses]
(True, None, ['nan_origin'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from precnb.pipeline.options import Options
from precnb.pipeline.sources import Loaded, Source, open_source

__all__ = ["Plan", "make_plan"]


@dataclass(frozen=True)
class Plan:
    """A triage decided: what is read, how, and which diagnoses run on it.

    Attributes
    ----------
    options : Options
        The options, with the layouts named by role as the inputs resolved them.
    target, baseline : Source
        The runs (the baseline None for one run).
    diagnoses : tuple
        The registered diagnoses asked for (:func:`precnb.analysis.registry.diagnoses`), in registry order.
    tolerance : object
        The comparison tolerance (a reference pair calibrated when one is given).
    stepwise : tuple or None
        ``(searching diagnosis, first-steps diagnoses, (baseline steps, offset))`` when the pair is read step batch
        by step batch (:func:`precnb.pipeline.stepwise_read.stepwise_plan`); None: read whole.
    loaded : Loaded
        What was read (and refused), filled in as the plan runs.
    common : dict
        The reading options every open shares (format, workers, client, progress, ranks).
    cache : dict
        What is read once per triage beside the runs (the monitor output, the loss log).
    """

    options: Options
    target: Source
    baseline: Source | None
    diagnoses: tuple[Any, ...]
    tolerance: Any
    stepwise: tuple[Any, list[Any], tuple[list[int], int]] | None = None
    loaded: Loaded = field(default_factory=Loaded)
    common: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)


def make_plan(inputs: Any, options: Options, *, whole: bool = False) -> Plan:
    """The :class:`Plan` of a triage of *inputs* (:func:`precnb.pipeline.inputs.normalize`) under *options*.

    *whole*: read the runs whole (no step batches).
    """
    from precnb.analysis import registry
    from precnb.pipeline import prepare
    from precnb.pipeline.stepwise_read import stepwise_plan
    from precnb.pipeline.tensors import wants_tensor_metrics  # issue #17

    # the triage's options name the layouts by role, as the inputs resolved them (a step's rerun reads the same)
    opts = options.with_(layouts=None, target_layout=inputs.target_layout, baseline_layout=inputs.baseline_layout,
                         mapping=inputs.mapping)
    loaded = Loaded()
    common = {"format": opts.format, "workers": opts.workers, "client": opts.client, "progress": opts.progress,
              "ranks": opts.ranks}
    tsrc, bsrc = inputs.sources()
    wanted = tuple(registry.diagnoses(opts.kinds))
    tolerance = prepare.tolerance_of(opts, lambda x: open_source(Source(x, "reference"), loaded=loaded, **common))
    chosen = None
    if not whole and bsrc is not None:  # tensor metrics cover the whole pair: read whole
        chosen = stepwise_plan(wanted, tsrc, bsrc, opts, whole=wants_tensor_metrics(opts, tsrc.value, bsrc.value))
    return Plan(options=opts, target=tsrc, baseline=bsrc, diagnoses=wanted, tolerance=tolerance, stepwise=chosen,
                loaded=loaded, common=common)

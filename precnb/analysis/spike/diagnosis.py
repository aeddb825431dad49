"""The ``loss_spike`` diagnosis: registered in :mod:`precnb.analysis.registry` (``precnb spike``).

It reads the run diagnosed (a dump or a monitor output) and, from the pipeline's parameters,
the monitor output (``params["monitor"]``, a dataset) and the loss log (``params["loss_log"]``,
a DataFrame ``step, loss[, rank]``; ``params["loss_source"]`` says where it was read), both
opened by its ``inputs`` hook (:func:`precnb.pipeline.tensors.side_inputs`, named by ``reads=``: the analysis
never reads files) from its own options ``monitor`` / ``loss`` (:class:`SpikeOptions`).

Examples
--------
>>> from precnb.analysis.registry import get
>>> get(LOSS_SPIKE).cli.command
'spike'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from precnb.analysis.hooks import CliHooks, ExplorerHooks, FindingHooks, InputHooks, OrderHooks
from precnb.analysis.options import option, suspects_limit
from precnb.analysis.registry import Context, Diagnosis, register

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["LOSS_SPIKE", "SpikeOptions"]

#: its kind, spelled here once
LOSS_SPIKE = "loss_spike"


@dataclass(frozen=True)
class SpikeOptions:
    """The loss-spike diagnosis's options (issue #29): what is read beside the run, every step of it."""

    limit: int = suspects_limit()
    monitor: Any = option(None, compare=False, help="msprobe monitor output (TrainerMon) of the same job, read beside "
                          "RUN: its gradients, updates and activations at every step", metavar="DIR", type="folder")
    loss: Any = option(None, compare=False, help="loss log of every step: CSV step,loss[,rank], TensorBoard event "
                       "files (a file or a folder), or a pandas.DataFrame with those columns", metavar="FILE")


def _run(ctx: Context) -> Any:
    from precnb.analysis.spike import loss_spike

    o = ctx.options.get(LOSS_SPIKE) or SpikeOptions()
    return loss_spike(ctx.target, monitor=ctx.params.get("monitor"), loss=ctx.params.get("loss_log"),
                      loss_source=str(ctx.params.get("loss_source") or "loss log"),
                      rule=ctx.params.get("loss_spike_rule"), limit=int(o.limit))


def _flags(ds: xr.Dataset, finding: Any, **_: Any) -> list[dict[str, Any]]:
    """The records the explorer colours: each cause's origin (on every rank when the cause names none)."""
    have = ds.indexes["tensor"]
    rows = []
    for c in finding.causes:
        if c.get("tensor") not in have or c.get("step") is None:
            continue
        ranks = [c["rank"]] if c.get("rank") is not None else [int(r) for r in ds["rank"].values]
        rows += [{"step": int(c["step"]), "rank": int(r), "tensor": str(c["tensor"])} for r in ranks]
    return rows


def _keep(f: Any, results: dict[str, Any]) -> bool:
    """A clean loss-spike search says no more than the NaN search's "nothing found" (its check is listed)."""
    return f.found or "nan_origin" not in results


def _plan(finding: Any, ds: xr.Dataset, **kw: Any) -> Any:
    from precnb.analysis.spike._plan import spike_plan

    return spike_plan(finding, ds, **kw)


register(Diagnosis(
    kind=LOSS_SPIKE, title="Loss spike", priority=25, mode="single", run=_run,
    description="loss spike (the first step whose loss departs from its own recent history; its origin rank, batch "
    "input, parameter or op; cause data, optimizer, hardware or numerics)", options=SpikeOptions,
    cli=CliHooks("spike", help="why did the loss spike: step, rank, origin (batch, parameter, op) and cause. RUN is a "
                 "dump (the steps around the spike suffice) or a monitor output",
                 emit="precnb.cli.spike_cmds:emit"),
    explorer=ExplorerHooks(flags=_flags), finding=FindingHooks(plan=_plan), order=OrderHooks(keep=_keep),
    reads=InputHooks("precnb.pipeline.tensors:side_inputs")))

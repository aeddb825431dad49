"""Inputs read beside the run: the monitor output and the loss log (the ``monitor`` / ``loss`` options).

The loss-spike diagnosis (:mod:`precnb.analysis.spike`) judges the loss of every step, which a
dump of the steps around an incident does not hold: the pipeline opens the job's monitor output
and its loss log here (the analysis never reads files) and hands them over as
``params["monitor"]`` (a dataset), ``params["loss_log"]`` (a DataFrame ``step, rank, loss``) and
``params["loss_source"]`` (where it was read).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["side_inputs"]


def _loss_table(value: Any) -> tuple[Any, str]:
    import pandas as pd

    if isinstance(value, (str, os.PathLike)):
        from precnb.io.losslog import read_loss_log

        df = read_loss_log(value)
        tag = df.attrs.get("tag")
        return df, f"loss log {os.fspath(value)}" + (f" (TensorBoard tag {tag!r})" if tag else "")
    if isinstance(value, pd.DataFrame):
        missing = {"step", "loss"} - set(value.columns)
        if missing:
            raise ValueError(f"the loss table needs columns step and loss (missing {sorted(missing)})")
        if list(value.columns) == ["step", "rank", "loss"]:
            return value, "loss table"  # already in shape (the analysis only reads it: the caller's is not touched)
        if "rank" in value:
            return value[["step", "rank", "loss"]], "loss table"
        return value[["step", "loss"]].assign(rank=float("nan"))[["step", "rank", "loss"]], "loss table"
    raise TypeError(f"loss: expected a path or a pandas.DataFrame, got {type(value).__name__}")


def side_inputs(opts: Any, loaded: Any, common: dict[str, Any]) -> dict[str, Any]:
    """``params`` entries for the ``monitor`` and ``loss`` options (empty when neither is given).

    Files of the monitor output that cannot be read are appended to ``loaded.failures``.

    Raises
    ------
    precnb.errors.PrecnbError
        When the loss log cannot be read (one line naming the file).
    """
    from precnb.pipeline.sources import Source, open_source

    out: dict[str, Any] = {}
    if opts.monitor is not None:
        out["monitor"] = open_source(Source(opts.monitor, "monitor"), loaded=loaded, **common)
    if opts.loss is not None:
        out["loss_log"], out["loss_source"] = _loss_table(opts.loss)
    return out

"""Why did the loss spike: the step, the origin (rank, batch input / parameter / op) and the kind of cause.

A **loss spike** is the first step whose loss departs from its own recent history
(:mod:`precnb.analysis.spike._rule`: a robust departure of ln(loss) from its recent trend, in
units of its own step-to-step noise, with a rise of at least 10 %; a jump of more than 10x
where the history is too short to estimate the noise, and on the gradient-norm proxy). Each
rank's loss and the run's are judged; the ranks that depart first at that step say whether it
is rank-local.

The causes are told apart from what the dump and the monitor hold
(:mod:`precnb.analysis.spike._causes`): **data** (the departing rank's batch inputs stand out),
**optimizer** (an update or an optimizer argument jumps without a gradient jump; the loss follows
a step later), **hardware** (one rank's gradient before the reduce departs from the other DP
ranks' by orders of magnitude while its inputs are ordinary) and **numerics** (an overflow, a
saturating float16/bfloat16 value, an underflow to zero or a loss-scale change precedes it).
Lead indicators are the trend breaks (:mod:`precnb.analysis.anomalies.trends`) before the spike, and the
finding's plan is the msprobe dump that confirms the cause (:mod:`precnb.analysis.spike._plan`).

Examples
--------
>>> import numpy as np, pandas as pd
>>> from precnb.analysis.spike import loss_spike
>>> log = pd.DataFrame({"step": np.arange(8), "loss": [4.4, 4.2, 3.9, 3.4, 2.9, 2.7, 6.1, 3.0]})
>>> f = loss_spike(loss=log)
>>> f.kind, f.step, f.rank
('loss_spike', 6, None)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from precnb.analysis.spike._finding import detect, loss_spike
    from precnb.analysis.spike._rule import LossSpikeRule, first_departure
    from precnb.analysis.spike._series import LossSeries, gather_series

__all__ = ["LossSeries", "LossSpikeRule", "detect", "first_departure", "gather_series", "loss_spike"]

_LAZY = {"detect": "_finding", "loss_spike": "_finding", "LossSpikeRule": "_rule", "first_departure": "_rule",
         "LossSeries": "_series", "gather_series": "_series"}


def __getattr__(name: str) -> object:
    # pandas on first use: the registry lists this family's diagnosis (precnb.analysis.spike.diagnosis) light
    if name in _LAZY:
        value = getattr(importlib.import_module(f"precnb.analysis.spike.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

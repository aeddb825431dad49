"""A finding at a fused optimizer's input names the parameter that list entry belongs to.

``Torch._fused_adamw_`` reads lists (parameters, gradients, first and second moments, …), one entry per
parameter, and msprobe records them as ``input.<list>.<entry>``: a first divergence there says "the optimizer",
not which layer. The optimizer runs after the backward, before any parameter changes, so entry *k* of its
parameter list holds, bit for bit, the statistics of one parameter the step's forward recorded: that
parameter's module is the finding's module.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["note_optimizer_parameter"]

_ENTRY = re.compile(r"^(?P<node>.+)\.input\.(?P<list>\d+)\.(?P<entry>\d+)$")
_LISTS = {0: "parameter", 1: "gradient", 2: "first moment (exp_avg)", 3: "second moment (exp_avg_sq)"}


def note_optimizer_parameter(f: Any, target: xr.Dataset) -> dict[str, Any] | None:
    """Name the parameter behind a finding at a fused optimizer's list entry (in place); returns the evidence.

    Sets ``evidence["optimizer_parameter"]`` (``entry``, ``list``, ``parameter``: the parameter record's label,
    ``module``) and the finding's module when it only said the optimizer. None when the finding is elsewhere,
    or no parameter record of that step has the entry's statistics (level L1 records none).

    >>> from types import SimpleNamespace
    >>> from precnb.schema import empty_dataset
    >>> f = SimpleNamespace(tensor="Torch._fused_adamw_.0.forward.input.1.3", step=0, rank=0, evidence={})
    >>> note_optimizer_parameter(f, empty_dataset()) is None
    True
    """
    from precnb.analysis.layout.rank_args import is_optimizer_api

    m = _ENTRY.match(str(getattr(f, "tensor", "") or ""))
    if m is None or not is_optimizer_api(m.group("node")) or f.step is None or f.rank is None:
        return None
    param_label = f"{m.group('node')}.input.0.{m.group('entry')}"
    labels = target.indexes["tensor"]
    if param_label not in labels or int(f.step) not in target.indexes["step"] or \
            int(f.rank) not in target.indexes["rank"]:
        return None
    si, ri = target.indexes["step"].get_loc(int(f.step)), target.indexes["rank"].get_loc(int(f.rank))
    stats = np.stack([np.asarray(target[s].values[si, ri]) for s in ("max", "min", "mean", "norm")], axis=-1)
    present = np.asarray(target["present"].values[si, ri], bool)
    j = labels.get_loc(param_label)
    if not present[j]:
        return None
    params = np.flatnonzero((target["role"].values == "parameter") & present)
    same = [int(k) for k in params if np.array_equal(stats[k], stats[j], equal_nan=True)]
    mods = {str(target["module"].values[k]) for k in same if str(target["module"].values[k])}
    if len(mods) != 1:  # none, or tensors of several modules with these statistics (zeros): nothing to say
        return None
    module = mods.pop()
    which = _LISTS.get(int(m.group("list")), f"list {m.group('list')}")
    ev = {"entry": int(m.group("entry")), "list": which, "parameter": str(target["tensor"].values[same[0]]),
          "module": module}
    f.evidence["optimizer_parameter"] = ev
    if getattr(f, "module", None) in (None, "", "optimizer"):
        f.module = module
    f.reason += f" (optimizer list entry {ev['entry']}: the {which} of {module}'s parameter)"
    return ev

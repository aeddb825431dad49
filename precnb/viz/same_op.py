"""One op over steps and ranks, followed by what it is (module, parent, shape), not by its call-counter label.

Examples
--------
>>> op_family("Torch.sqrt.3.forward.output.0")
'Torch.sqrt.#.forward.output.0'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from precnb.schema import meta_changes
from precnb.viz.frames import _fmt, _index

__all__ = ["SERIES_COLUMNS", "op_family", "same_op_series"]

SERIES_COLUMNS = ["step", "value", "series", "tensor", "rank", "run", "nonfinite", "value_text"]
_API_COUNTER = re.compile(r"\.\d+\.(forward|backward)\.")
_MODULE_COUNTER = re.compile(r"\.(forward|backward)\.\d+\.")


def op_family(label: str) -> str:
    """A tensor label without its call counter: the labels one op can have on ranks whose counters differ.

    Examples
    --------
    >>> op_family("Torch.sqrt.3.forward.output.0")
    'Torch.sqrt.#.forward.output.0'
    >>> op_family("Module.blocks.0.attn.Attention.forward.1.input.0")
    'Module.blocks.0.attn.Attention.forward.#.input.0'
    """
    label = _API_COUNTER.sub(lambda m: f".#.{m.group(1)}.", label, count=1)
    return _MODULE_COUNTER.sub(lambda m: f".{m.group(1)}.#.", label, count=1)


def same_op_series(ds: xr.Dataset, tensor: str, *, step: int, rank: int, stat: str = "norm",
                   ranks: Sequence[int] | None = None, steps: Sequence[int] | None = None) -> pd.DataFrame:
    """One op over steps and ranks, followed by what it is, not by its label.

    A rank that runs one op more (or less) shifts its call counters: the label *tensor* names the op
    recorded at (*step*, *rank*) there and other ops elsewhere. Here each (step, rank) takes the label
    of the same family (:func:`op_family`) whose module, parent and shape are the op's at (*step*,
    *rank*) — *tensor* itself where it still names that op.

    Parameters
    ----------
    ds : xarray.Dataset
        One run (no ``run`` dim).
    tensor : str
    step, rank : int
        Where *tensor* names the op to follow.
    stat : str
    ranks, steps : sequence of int, optional
        Restrict (default: all).

    Returns
    -------
    pandas.DataFrame
        :data:`SERIES_COLUMNS`, one line per rank (``tensor``: the label the op has at that point);
        ``attrs["missing"]``: ``{rank: [steps]}`` where a rank recorded that step but no entry of
        it is this op; ``attrs["relabelled"]``: ``{rank: [labels]}`` other than *tensor* used.
    """
    from precnb.analysis.masks import recorded
    from precnb.schema import entry_meta

    table = meta_changes(ds)
    labels = [str(t) for t in ds.indexes["tensor"]]
    fam = op_family(tensor)
    cands = [tensor] + [t for t in labels if t != tensor and op_family(t) == fam]
    key = {f: entry_meta(ds, tensor, step, rank, table)[f] for f in ("module", "parent", "shape")}
    si, ri = _index(ds, "step", steps), _index(ds, "rank", ranks)
    tj = ds.indexes["tensor"].get_indexer(cands)
    pres = np.asarray(recorded(ds, stat).values)
    anything = np.asarray(ds["present"].values)[np.ix_(si, ri)].any(axis=2)
    vals = np.asarray(ds[stat].values)
    step_vals, rank_vals = ds["step"].values[si], ds["rank"].values[ri]
    rows: list[dict[str, Any]] = []
    missing: dict[int, list[int]] = {}
    relabelled: dict[int, list[str]] = {}
    for b, r in enumerate(rank_vals.tolist()):
        for a, s in enumerate(step_vals.tolist()):
            hit = next((k for k, t in enumerate(cands) if pres[si[a], ri[b], tj[k]] and all(
                entry_meta(ds, t, s, r, table)[f] == v for f, v in key.items())), None)
            if hit is None:
                if anything[a, b]:
                    missing.setdefault(int(r), []).append(int(s))
                continue
            v = float(vals[si[a], ri[b], tj[hit]])
            if cands[hit] != tensor and cands[hit] not in relabelled.setdefault(int(r), []):
                relabelled[int(r)].append(cands[hit])
            rows.append({"step": int(s), "value": v if np.isfinite(v) else np.nan, "series": f"rank {r}",
                         "tensor": cands[hit], "rank": int(r), "run": "", "nonfinite": not np.isfinite(v),
                         "value_text": _fmt(v)})
    out = pd.DataFrame(rows, columns=SERIES_COLUMNS)
    out.attrs.update(stat=stat, ranks_total=len(rank_vals), ranks_drawn=int(out["rank"].nunique()) if len(out) else 0,
                     missing=missing, relabelled={r: v for r, v in relabelled.items() if v}, same_op=True)
    return out

"""NaN/Inf *events*: the non-finite records that are not there by design.

Healthy models carry ±inf on purpose: a causal mask written with ``masked_fill(-inf)`` and
the softmax that reads it. :func:`event_mask` sets those apart as *benign*:

* an output infinity created by a masking API (:data:`MASKING_APIS`) is benign;
* an infinity that flows on unchanged (an input whose statistics equal an earlier benign
  tensor's: the same tensor seen again as the next op's input) is benign, and so is an
  output of a node whose inputs carry benign infinities;
* a tensor that is non-finite at every step and rank where it is recorded is so by design.

Everything else that is NaN, or infinite, is an event. The NaN-origin search
(:mod:`precnb.analysis.nan.origin`, which re-exports these names), the earliness of anomalous
records (:mod:`precnb.analysis.causal.earliness`), the anomaly series and the loss spike's
numerics all use this one rule.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo
from precnb.analysis.masks import nonfinite
from precnb.analysis.undefined import undefined_mask

__all__ = ["MASKING_APIS", "event_mask", "lazy_persistence", "persistent_nonfinite"]

MASKING_APIS = frozenset({
    "masked_fill", "masked_fill_", "where", "fill_", "full", "full_like", "new_full", "triu", "tril",
    "triu_", "tril_", "masked_scatter", "masked_scatter_", "index_fill", "index_fill_", "fill",
    "scatter", "scatter_", "log", "clamp", "clamp_min", "minimum", "maximum",
})


def _api_short(api: str) -> str:
    return api.rsplit(".", 1)[-1]


def persistent_nonfinite(n_recorded: object, n_nonfinite: object) -> np.ndarray:
    """Per tensor: non-finite wherever it is recorded, and recorded at least twice (by design).

    Parameters
    ----------
    n_recorded, n_nonfinite : array-like
        Per-tensor counts over every (step, rank) of the run.

    Examples
    --------
    >>> persistent_nonfinite([4, 4, 1], [4, 3, 1]).tolist()
    [True, False, False]
    """
    n_rec, n_bad = np.asarray(n_recorded), np.asarray(n_nonfinite)
    return (n_bad == n_rec) & (n_rec >= 2)


def lazy_persistence(ds: xr.Dataset, *extra: xr.DataArray) -> tuple[np.ndarray, tuple[xr.DataArray, ...]]:
    """:func:`persistent_nonfinite` of a dask-backed run in one chunked pass (plus *extra* reductions)."""
    import dask

    anynf = nonfinite(ds, kind="any")
    n_rec, n_bad, *rest = dask.compute(ds["present"].sum(["step", "rank"]), anynf.sum(["step", "rank"]), *extra)
    return persistent_nonfinite(n_rec, n_bad), tuple(rest)


_EVENTS = DatasetMemo(size=4)


def _copies(masks: tuple[xr.DataArray, xr.DataArray]) -> tuple[xr.DataArray, xr.DataArray]:
    return tuple(m.copy(deep=False, data=m.values.copy()) for m in masks)  # type: ignore[return-value]


def event_mask(ds: xr.Dataset, *, persistent: np.ndarray | None = None) -> tuple[xr.DataArray, xr.DataArray]:
    """Events (non-benign NaN/Inf) and benign infinities, both (step, rank, tensor) bool.

    *persistent* (per tensor: non-finite at every (step, rank) where it is recorded, at least
    twice) defaults to what *ds* itself shows; pass the whole run's when *ds* holds some of
    its steps.

    Computed once per dataset (and *persistent*): the NaN-origin search, the explorer's "first bad"
    order of the same run (:func:`precnb.analysis.causal.earliness.bad_records`) and its "events"
    colour ask for the same masks (:class:`~precnb.analysis._memo.DatasetMemo`; each caller gets its
    own copy).
    """
    key = ("event_mask", None if persistent is None else np.asarray(persistent, bool).tobytes())
    return _EVENTS.get([ds], key, lambda: _event_mask(ds, persistent), copy=_copies)


def _event_mask(ds: xr.Dataset, persistent: np.ndarray | None) -> tuple[xr.DataArray, xr.DataArray]:
    undefined = undefined_mask(ds)  # buffers with no defined value (beta=0 inputs, irecv before the wait)
    nan = nonfinite(ds, kind="nan").values & ~undefined
    inf = (nonfinite(ds, kind="inf").values & ~nan & ~undefined)
    anynf = nan | inf
    if persistent is None:
        persistent = persistent_nonfinite(ds["present"].values.sum(axis=(0, 1)), anynf.sum(axis=(0, 1)))
    kinds = ds["kind"].values
    persistent_nan_ok = persistent & (kinds == "monitor")
    roles = ds["role"].values
    nodes = ds["node"].values
    masking = np.fromiter((_api_short(str(a)) in MASKING_APIS for a in ds["api"].values), bool,
                          ds.sizes["tensor"])
    seq = ds["seq"].values
    stats = np.stack([ds[s].values for s in ("max", "min", "mean", "norm")], axis=-1)
    events = np.zeros_like(anynf)
    benign = np.zeros_like(anynf)
    for si in range(anynf.shape[0]):
        for ri in range(anynf.shape[1]):
            cols = np.flatnonzero(anynf[si, ri])
            if not len(cols):
                continue
            cols = cols[np.argsort(seq[si, ri, cols], kind="stable")]
            sigs: set[bytes] = set()
            benign_input_nodes: set[str] = set()
            for j in cols:
                sig = stats[si, ri, j].tobytes()
                if persistent[j] and (inf[si, ri, j] or persistent_nan_ok[j]):
                    benign[si, ri, j] = True
                    sigs.add(sig)
                    continue
                if nan[si, ri, j]:
                    events[si, ri, j] = True
                    continue
                node = str(nodes[j])
                if roles[j] in ("input", "parameter"):
                    ok = sig in sigs
                    if ok:
                        benign_input_nodes.add(node)
                else:
                    ok = bool(masking[j]) or node in benign_input_nodes or sig in sigs
                if ok:
                    benign[si, ri, j] = True
                    sigs.add(sig)
                else:
                    events[si, ri, j] = True
    like = ds["present"]
    return like.copy(deep=False, data=events), like.copy(deep=False, data=benign)  # (coordinates not copied)

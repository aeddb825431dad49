"""Which tensors a tensor comparison reads: labels picked by module, node or pattern; target → baseline pairing.

Used by :func:`precnb.tensor_compare.tensor_metrics`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from precnb.io._expect import Expected

__all__ = ["select_tensors"]


def select_tensors(ds: xr.Dataset, tensors: Any = None) -> list[str]:
    r"""Tensor labels of *ds* picked by *tensors*, in dataset order.

    Parameters
    ----------
    ds : xarray.Dataset
    tensors : None, str or iterable of str
        None: every tensor. A list: exactly these labels. A string: the tensors of that module
        (``blocks.1.attn`` and below) or node (``Functional.linear.0.forward``), else a regular
        expression searched in the labels.

    Returns
    -------
    list of str

    Raises
    ------
    KeyError
        Naming listed labels that are not in *ds*.
    ValueError
        When a string matches nothing.

    Examples
    --------
    >>> ds = xr.Dataset(coords={"tensor": ["a.0.forward.output.0", "b.0.forward.output.0"],
    ...                          "module": ("tensor", ["blocks.1", "blocks.10"]),
    ...                          "node": ("tensor", ["a.0.forward", "b.0.forward"])})
    >>> select_tensors(ds, "blocks.1")
    ['a.0.forward.output.0']
    >>> select_tensors(ds, r"^b\.")
    ['b.0.forward.output.0']
    """
    labels = [str(x) for x in ds["tensor"].values]
    if tensors is None:
        return labels
    if isinstance(tensors, str):
        modules = [str(x) for x in ds["module"].values] if "module" in ds.coords else [""] * len(labels)
        nodes = [str(x) for x in ds["node"].values] if "node" in ds.coords else [""] * len(labels)
        picked = [lbl for lbl, mod, node in zip(labels, modules, nodes, strict=True)
                  if tensors in (lbl, node, mod) or mod.startswith(tensors + ".")]
        if picked:
            return picked
        try:
            rx = re.compile(tensors)
        except re.error as exc:
            raise ValueError(f"tensors={tensors!r} is neither a module, a node nor a valid regular "
                             f"expression ({exc})") from None
        picked = [lbl for lbl in labels if rx.search(lbl)]
        if not picked:
            raise ValueError(f"tensors={tensors!r} matches no module, node or tensor label")
        return picked
    wanted = [str(x) for x in tensors]
    known = set(labels)
    missing = [x for x in wanted if x not in known]
    if missing:
        raise KeyError(f"not in the target run: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return wanted


def _pairing(alignment: Any) -> Callable[[str], str]:
    """Map target label → baseline label: any mapping (missing labels pair by name) or an Alignment."""
    if alignment is None:
        return lambda label: label
    tensor_map = getattr(alignment, "tensor_map", None)  # a precnb.Alignment
    if callable(tensor_map):
        alignment = tensor_map()
    for name in ("baseline_tensor", "baseline_label"):
        fn = getattr(alignment, name, None)
        if callable(fn):
            return lambda label: str(fn(label) or label)
    if isinstance(alignment, Mapping):
        return lambda label: str(alignment.get(label, label))
    raise TypeError(f"alignment: expected a mapping target label -> baseline label, got {type(alignment).__name__}")


def _entries(ds: xr.Dataset, labels: list[str], steps: list[int], ranks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(data_name, expected)`` over (step, rank, label); "" / None where the label is absent or not saved.

    *expected* is what each file's dump record says (:class:`precnb.io._expect.Expected`: its
    element count and dtype), checked before the file is materialised.
    """
    out = np.full((len(steps), len(ranks), len(labels)), "", dtype=object)
    exp = np.full(out.shape, None, dtype=object)
    known = ds.indexes["tensor"]
    have = [i for i, lbl in enumerate(labels) if lbl in known]
    if have:
        names = [labels[i] for i in have]
        sub = ds["data_name"].sel(step=steps, rank=ranks, tensor=names).values
        pres = ds["present"].sel(step=steps, rank=ranks, tensor=names).values
        out[:, :, have] = np.where(pres, sub, "")
        numel = ds["numel"].sel(step=steps, rank=ranks, tensor=names).values if "numel" in ds else None
        dtypes = ds["dtype"].sel(tensor=names).values if "dtype" in ds.coords else [None] * len(names)
        for s, r, k in zip(*np.nonzero(pres), strict=True):
            exp[s, r, have[k]] = Expected.of(None if numel is None else numel[s, r, k], dtypes[k])
    return out, exp

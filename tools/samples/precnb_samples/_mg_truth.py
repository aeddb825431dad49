"""Ground truth of the ``megatron`` sample, read back from its dumps (torch-free, independent of precnb).

Megatron-Core names a module ``Module.<chunk>.<path inside the chunk>.<Class>.<direction>.<micro-batch>``
with layers numbered locally per chunk; :func:`module_key` turns that into the whole model's name
(``decoder.layers.<global>``) with the chunk's layer numbers that the worker reported. Statistics of one
global tensor held by several ranks (TP shards, sequence-parallel and data-parallel pieces) are merged
exactly (max of Max, min of Min, numel-weighted Mean, root of the summed squared Norms) and compared
with the whole-model run by :func:`relation`.

>>> module_key("Module.1.decoder.layers.0.mlp.MLP.forward.1", {"0": [1], "1": [3]})
('decoder.layers.2.mlp', 'MLP', 'forward', 1)
>>> module_key("Functional.linear.0.forward", {"0": [1]}) is None
True
>>> leaf = {"shape": [4, 2], "Max": 2.0, "Min": -1.0, "Mean": 0.5, "Norm": 3.0}
>>> half = {"shape": [2, 2], "Max": 2.0, "Min": -1.0, "Mean": 0.5, "Norm": 3.0 / 2 ** 0.5}
>>> relation(leaf, [half, half])[0]
'sharded dim 0'
>>> relation(leaf, [leaf, leaf])[0]
'replicated'
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812

__all__ = ["LAYER", "MODULE", "api_children", "first_difference", "merge", "module_key", "module_records",
           "relation", "undefined_leaves"]

MODULE = re.compile(r"^Module\.(\d+)\.(.+)\.([A-Za-z_]\w*)\.(forward|backward|parameters_grad)\.(\d+)$")
LAYER = re.compile(r"^decoder\.layers\.(\d+)(\.|$)")
RTOL = 2e-4


def module_key(node: str, layer_numbers: dict[str, list[int]]) -> tuple[str, str, str, int] | None:
    """``(global module path, class, direction, call index)`` of a Megatron module node (``None`` for APIs).

    *layer_numbers* maps the chunk (``"0"``, ``"1"``...) to Megatron's ``layer_number`` of each local layer.
    """
    m = MODULE.match(node)
    if m is None:
        return None
    chunk, path, cls, direction, index = m.groups()
    lm = LAYER.match(path)
    if lm:
        glob = layer_numbers[chunk][int(lm.group(1))] - 1
        path = f"decoder.layers.{glob}" + path[lm.end(1):]
    return path, cls, direction, int(index)


def module_records(data: dict[str, Any], layer_numbers: dict[str, list[int]]) -> dict[tuple[str, str, str, int], str]:
    """Module key -> node name for one (step, rank) dump (modules only)."""
    out = {}
    for node in data:
        key = module_key(node, layer_numbers)
        if key is not None:
            out[key] = node
    return out


def undefined_leaves(node: str, record: dict[str, Any]) -> list[str]:
    """Leaves of *record* that have no defined value by construction.

    ``baddbmm``'s ``input`` with ``beta=0`` (Megatron's ``torch.empty`` attention buffer) and the irecv
    buffers of ``batch_isend_irecv`` (recorded before the wait).
    """
    out = []
    if node.startswith("Torch.baddbmm.") and node.endswith(".forward"):
        beta = (record.get("input_kwargs") or {}).get("beta", {})
        if isinstance(beta, dict) and beta.get("value") == 0:
            out.append("input_args.0")
    if node.startswith("Distributed.batch_isend_irecv.") and node.endswith(".forward"):
        for side in ("input_args", "output"):
            ops = (record.get(side) or [[]])[0] or []
            out += [f"{side}.0.{i}.tensor" for i, op in enumerate(ops)
                    if isinstance(op, dict) and op.get("op") == "irecv"]
    return out


def _stats(leaf: dict[str, Any]) -> dict[str, Any]:
    return {k: leaf.get(k) for k in D.STAT_KEYS}


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def merge(shards: list[dict[str, Any]]) -> dict[str, float | None]:
    """Exact statistics of the concatenation of *shards* (numel-weighted Mean; NaN propagates)."""
    out: dict[str, float | None] = {}
    stats = [_stats(s) for s in shards]
    sizes = [_numel(s["shape"]) for s in shards]
    for key in D.STAT_KEYS:
        vals = [s[key] for s in stats]
        if vals and all(isinstance(v, bool) for v in vals) and key in ("Max", "Min"):
            out[key] = any(vals) if key == "Max" else all(vals)  # msprobe: bool Max = any(), Min = all()
        elif any(v is None or isinstance(v, bool) for v in vals):
            out[key] = None
        elif any(isinstance(v, float) and math.isnan(v) for v in vals):
            out[key] = math.nan
        elif key == "Max":
            out[key] = max(vals)
        elif key == "Min":
            out[key] = min(vals)
        elif key == "Mean":
            out[key] = sum(v * n for v, n in zip(vals, sizes, strict=True)) / sum(sizes)
        else:
            out[key] = math.sqrt(sum(v * v for v in vals))
    return out


def _err(a: Any, b: Any, scale: float) -> float:
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return 0.0 if a == b else math.inf
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    if math.isinf(a) or math.isinf(b):
        return 0.0 if a == b else math.inf
    return abs(a - b) / max(abs(a), abs(b), scale, 1e-30)


def _max_err(base: dict[str, Any], got: dict[str, Any]) -> float:
    finite = [abs(v) for v in (base.get("Max"), base.get("Min"))
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    scale = 1e-3 * max(finite, default=0.0)
    return max(_err(base.get(k), got.get(k), scale) for k in D.STAT_KEYS)


def relation(base: dict[str, Any], shards: list[dict[str, Any]], scale_by: float = 1.0) -> tuple[str, float]:
    """How the pieces of one tensor on several ranks relate to the whole-model tensor *base*.

    ``replicated`` (every piece equals it), ``sharded dim d`` (the pieces concatenate along d),
    ``mean of pieces`` (same shape, the pieces' Means average to its Mean: data-parallel local gradients),
    ``partial sum`` (the Means add up: a reduction not yet done), else ``differs``. *scale_by* multiplies
    the merged statistics first (data-parallel activation gradients are ``dp`` times the whole-model ones:
    each rank's loss is the mean over its own part of the batch). Returns the relation and its max
    scale-aware error.
    """
    shape = base.get("shape")
    shapes = [s.get("shape") for s in shards]

    def scaled(stats: dict[str, Any]) -> dict[str, Any]:
        if scale_by == 1.0:
            return stats
        out = dict(stats)
        for k in ("Mean", "Norm", "Max", "Min"):
            if isinstance(out.get(k), float):
                out[k] = out[k] / scale_by
        if scale_by < 0:
            out["Max"], out["Min"] = out["Min"], out["Max"]
        return out

    if all(s == shape for s in shapes):
        errs = [_max_err(base, _stats(s)) for s in shards]
        if max(errs) <= RTOL:
            return "replicated", max(errs)
        means = [s.get("Mean") for s in shards]
        if isinstance(base.get("Mean"), float) and all(isinstance(m, float) for m in means):
            finite = [abs(v) for v in (base.get("Max"), base.get("Min")) if isinstance(v, float) and math.isfinite(v)]
            scale = 1e-3 * max(finite, default=0.0)
            for name, value in (("mean of pieces", sum(means) / len(means)), ("partial sum", sum(means))):
                err = _err(base["Mean"], value, scale)
                if err <= RTOL:
                    return name, err
        return "differs", max(errs)
    if not (isinstance(shape, list) and all(isinstance(s, list) and len(s) == len(shape) for s in shapes)):
        return "differs", math.inf
    dims = {i for s in shapes for i, (a, b) in enumerate(zip(shape, s, strict=True)) if a != b}
    if len(dims) != 1:
        return "differs", math.inf
    dim = dims.pop()
    if sum(s[dim] for s in shapes) != shape[dim]:
        return "differs", math.inf
    err = _max_err(base, scaled(merge(shards)))
    return (f"sharded dim {dim}" if err <= RTOL else f"sharded dim {dim} (does not merge)"), err


def api_children(data: dict[str, Any], construct: dict[str, Any], layer_numbers: dict[str, list[int]]
                 ) -> dict[tuple[str, str, str, int], Counter[str]]:
    """Module key -> counts of the API names (counter dropped) whose parent is that module node."""
    out: dict[tuple[str, str, str, int], Counter[str]] = {}
    for node in data:
        if node.startswith("Module."):
            continue
        parent = D.parent_of(construct, node)
        key = module_key(parent, layer_numbers) if parent else None
        if key is None:
            continue
        parts = node.split(".")
        out.setdefault(key, Counter())[".".join(parts[:-2])] += 1
    return out


def first_difference(base: dict[str, Any], target: dict[str, Any]
                     ) -> tuple[str | None, list[str], list[tuple[str, str]]]:
    """First node (target dump order) whose leaves differ bit-exactly, ignoring undefined leaves.

    Returns the node, its differing leaves and every ``(node, leaf)`` set aside as undefined that differed.
    """
    skipped: list[tuple[str, str]] = []
    for node, rec in target.items():
        if node not in base:
            return node, ["(only in target)"], skipped
        undefined = set(undefined_leaves(node, rec))
        diff = D.differing_leaves(base[node], rec)
        skipped += [(node, p) for p in diff if any(p == u or p.startswith(u + ".") for u in undefined)]
        real = [p for p in diff if not any(p == u or p.startswith(u + ".") for u in undefined)]
        if real:
            return node, real, skipped
    return None, [], skipped


def rel(path: Path, root: Path) -> str:
    """*path* relative to *root* as a string."""
    return str(path.relative_to(root))

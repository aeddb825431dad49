"""Mapping files → pairing hints, for the two runs at hand.

msprobe's files speak of the target ("NPU") and the baseline ("bench") in that order; if a
file's names fit the baseline better than the target (the user swapped the runs), it is read
the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable

from precnb.analysis.align.pairing import Hints
from precnb.analysis.align.tree import ROOT, RunTree
from precnb.mapping import MappingSpec
from precnb.naming import op_key

__all__ = ["hints_from"]


def _classes(tree: RunTree) -> set[str]:
    return {m.cls for m in tree.modules.values() if m.cls}


def _names(tree: RunTree) -> set[str]:
    return {m.name for m in tree.modules.values() if m.path}


def _fits(spec: MappingSpec, tree: RunTree) -> int:
    """How many of a one-sided file's left-hand names occur in *tree*."""
    if spec.kind == "layer":
        classes, names = _classes(tree), _names(tree)
        score = sum(1 for c in spec.layer if c in classes)
        score += sum(1 for sub in spec.layer.values() for k in sub if k.split(".")[0] in names)
        return score
    if spec.kind == "cell":
        paths = {f"{m.path}.{m.cls}" for m in tree.modules.values() if m.cls}
        return sum(1 for k in spec.cell if k.replace("Cell.", "").replace("Module.", "") in paths)
    if spec.kind == "data":
        labels = set(tree.labels)
        return sum(1 for k in spec.data if k in labels)
    return 0


def _layer_paths(layer: dict[str, dict[str, str]], tree: RunTree) -> dict[str, str]:
    """Each module path of *tree* renamed child by child through a layer mapping."""
    renamed = {ROOT: ROOT}
    order = sorted(tree.modules, key=lambda p: (p.count(".") if p else -1, p))
    for path in order:
        if not path:
            continue
        parent = path.rsplit(".", 1)[0] if "." in path else ROOT
        name = path.rsplit(".", 1)[-1]
        pcls = tree.modules[parent].cls if parent in tree.modules else None
        table = layer.get("TopLayer", {}) if parent == ROOT else layer.get(pcls or "", {})
        if parent != ROOT and not table and tree.modules[parent].virtual:
            # a container (never called, no class): its children keep their names
            table = {}
        new = table.get(name, name)
        base = renamed.get(parent, parent)
        renamed[path] = f"{base}.{new}" if base else new
    return renamed


def _api_renames(layer: dict[str, dict[str, str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for sub in layer.values():
        for tgt, base in sub.items():
            out.setdefault(op_key(base.split(".")[-1]), set()).add(op_key(tgt.split(".")[-1]))
    return out


def hints_from(specs: Iterable[MappingSpec], tb: RunTree, tt: RunTree) -> Hints:
    """Combine mapping files into :class:`Hints` for the baseline *tb* and target *tt*."""
    h = Hints()
    for spec in specs:
        if spec.kind == "precnb":
            h.modules.update(spec.modules)
            h.nodes.update(spec.nodes)
            h.tensors.update(spec.tensors)
            h.unpair_nodes.update(spec.unpair)
            for level, found in spec.found.items():
                h.found.setdefault(level, {}).update(found)
            continue
        flip = _fits(spec, tb) > _fits(spec, tt)
        tgt_tree, base_tree = (tb, tt) if flip else (tt, tb)
        if spec.kind == "layer":
            renamed = _layer_paths(spec.layer, tgt_tree)
            for path, new in renamed.items():
                if path and new in base_tree.modules:
                    b, t = (path, new) if flip else (new, path)
                    h.modules.setdefault(b, t)
            for base_key, tgt_keys in _api_renames(spec.layer).items():
                if flip:
                    for tk in tgt_keys:
                        h.api_names.setdefault(tk, set()).add(base_key)
                else:
                    h.api_names.setdefault(base_key, set()).update(tgt_keys)
        elif spec.kind == "cell":
            by_path_t = {f"{m.path}.{m.cls}": m.path for m in tgt_tree.modules.values() if m.cls}
            by_path_b = {f"{m.path}.{m.cls}": m.path for m in base_tree.modules.values() if m.cls}
            for k, v in spec.cell.items():
                k2 = k.replace("Cell.", "", 1) if k.startswith("Cell.") else k
                v2 = v.replace("Module.", "", 1) if v.startswith("Module.") else v
                if k2 in by_path_t and v2 in by_path_b:
                    t, b = by_path_t[k2], by_path_b[v2]
                    if flip:
                        t, b = b, t
                    h.modules.setdefault(b, t)
        elif spec.kind == "data":
            for k, v in spec.data.items():
                b, t = (k, v) if flip else (v, k)
                h.tensors.setdefault(b, t)
        elif spec.kind == "api":
            for item in spec.api:
                ms, pt = op_key(str(item["ms_api"])), op_key(str(item["pt_api"]))
                base_is_pt = tb.framework != "mindspore"
                b, t = (pt, ms) if base_is_pt else (ms, pt)
                h.api_names.setdefault(b, set()).add(t)
    return h

"""Mapping files → pairing hints, for the two runs at hand.

msprobe's files speak of the target ("NPU") and the baseline ("bench") in that order; if a
file's names fit the baseline better than the target (the user swapped the runs), it is read
the other way round. precnb's own file names both sides: a file saved by ``align -o`` and reused
with the runs swapped fits them reversed, and is read reversed (and said so).

Every pair is checked against both runs before it is kept: a pair naming a module, node or tensor
that one run does not have is ignored, and a second pair onto the same module, node or tensor
(many-to-one: modules, nodes and tensors pair one to one; only msprobe's data and API mappings
may map several names onto one) is ignored too; each is listed in :attr:`Hints.problems`.
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


_KINDS = {"modules": ("module", "modules"), "nodes": ("node", "nodes"), "tensors": ("tensor", "labels")}


def _names_of(tree: RunTree, key: str) -> set[str]:
    return set(getattr(tree, _KINDS[key][1]))


def _discriminating(pairs: dict[str, str], base: set[str], targ: set[str]) -> int:
    """How many pairs whose two names differ fit (baseline, target) = (*base*, *targ*)."""
    return sum(1 for b, t in pairs.items() if b != t and b in base and t in targ)


def _precnb_hints(spec: MappingSpec, tb: RunTree, tt: RunTree, h: Hints) -> None:
    """The precnb kind: each pair checked against both runs (the file read reversed if it fits so)."""
    where = spec.source or "mapping"
    h.problems.extend(f"{where}: {p}" for p in spec.problems)
    straight = sum(_discriminating(getattr(spec, k), _names_of(tb, k), _names_of(tt, k)) for k in _KINDS)
    reverse = sum(_discriminating(getattr(spec, k), _names_of(tt, k), _names_of(tb, k)) for k in _KINDS)
    flip = reverse > straight
    if flip:
        h.problems.append(f"{where}: its pairs fit these runs the other way round ({reverse} pair(s) reversed, "
                          f"{straight} as written): it was saved with baseline and target swapped; read reversed")
    for key, (what, _) in _KINDS.items():
        base_names, targ_names = _names_of(tb, key), _names_of(tt, key)
        out: dict[str, str] = getattr(h, key)
        taken = set(out.values())
        for b0, t0 in getattr(spec, key).items():
            b, t = (t0, b0) if flip else (b0, t0)
            missing = [f"the baseline has no {what} {b!r}"] if b not in base_names else []
            missing += [f"the target has no {what} {t!r}"] if t not in targ_names else []
            if missing:
                h.problems.append(f"{where}: {key} pair {b!r} -> {t!r} ignored: {' and '.join(missing)}")
            elif t in taken or b in out:
                h.problems.append(f"{where}: {key} pair {b!r} -> {t!r} ignored: {t if t in taken else b!r} is "
                                  f"already paired ({what}s pair one to one)")
            else:
                out[b] = t
                taken.add(t)
                how = spec.found.get(key, {}).get(b0)  # how the pair was found when the file was written
                if how is not None:
                    h.found.setdefault(key, {})[b] = how
    unpair = set(spec.unpair)
    for n in sorted(unpair - set(tt.nodes)):
        h.problems.append(f"{where}: unpair {n!r} ignored: the target has no node {n!r}")
    h.unpair_nodes.update(unpair & set(tt.nodes))


def hints_from(specs: Iterable[MappingSpec], tb: RunTree, tt: RunTree) -> Hints:
    """Combine mapping files into :class:`Hints` for the baseline *tb* and target *tt*."""
    h = Hints()
    for spec in specs:
        if spec.kind == "precnb":
            _precnb_hints(spec, tb, tt, h)
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
            where = spec.source or "cell mapping"
            for k, v in spec.cell.items():
                k2 = k.replace("Cell.", "", 1) if k.startswith("Cell.") else k
                v2 = v.replace("Module.", "", 1) if v.startswith("Module.") else v
                if k2 in by_path_t and v2 in by_path_b:
                    t, b = by_path_t[k2], by_path_b[v2]
                    if flip:
                        t, b = b, t
                    if b in h.modules or t in h.modules.values():
                        h.problems.append(f"{where}: {k!r}: {v!r} ignored: a module already paired (modules pair "
                                          "one to one)")
                        continue
                    h.modules[b] = t
                elif any(c in k2 or c in v2 for c in "./"):  # a path (not a class rename) naming nothing
                    h.problems.append(f"{where}: {k!r}: {v!r} ignored: names no module of the runs")
        elif spec.kind == "data":
            where = spec.source or "data mapping"
            base_labels, targ_labels = set(base_tree.labels), set(tgt_tree.labels)
            for k, v in spec.data.items():
                if k not in targ_labels or v not in base_labels:
                    h.problems.append(f"{where}: {k!r}: {v!r} ignored: names no tensor of the "
                                      f"{'target' if k not in targ_labels else 'baseline'}")
                    continue
                b, t = (k, v) if flip else (v, k)
                h.many_tensors.setdefault(t, b)  # the format maps several tensors onto one
        elif spec.kind == "api":
            for item in spec.api:
                ms, pt = op_key(str(item["ms_api"])), op_key(str(item["pt_api"]))
                base_is_pt = tb.framework != "mindspore"
                b, t = (pt, ms) if base_is_pt else (ms, pt)
                h.api_names.setdefault(b, set()).add(t)
    return h

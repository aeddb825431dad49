"""The alignment of two runs, a first-class object: computed once, shown, saved, edited, reused.

An :class:`Alignment` says, for a baseline and a target whose names may differ, which module,
node and tensor of one is which of the other, how each pair was found (``name``, ``structure``,
``shape``, ``value``, ``user``) and how sure it is; and why each unpaired node is unpaired
(framework glue, a module level the other run lacks, a scope the other run did not capture,
or a real extra or missing computation). :meth:`Alignment.apply` renames the baseline into the
target's names, so that every comparison is arithmetic on one grid.

Examples
--------
>>> from precnb.analysis.align.alignment import Alignment, Pair
>>> a = Alignment(tensors=[Pair("x.0.forward.output.0", "y.0.forward.output.0", "value", 0.9)])
>>> a.tensor_map()
{'y.0.forward.output.0': 'x.0.forward.output.0'}
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from precnb.analysis._memo import DatasetMemo

__all__ = ["ALIGNMENT_SCHEMA", "Alignment", "Pair"]

_APPLIED = DatasetMemo(size=2)  # Alignment.apply of a baseline (the comparison and the pre-flight checks)

ALIGNMENT_SCHEMA = "precnb.alignment/1"
_COORDS = ("node", "module", "api", "kind", "direction", "role", "parent", "call", "micro_step")


@dataclass(frozen=True)
class Pair:
    """One pair: the baseline's name, the target's, how it was found and how sure (0–1)."""

    baseline: str
    target: str
    how: str
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"baseline": self.baseline, "target": self.target, "how": self.how,
                "confidence": round(float(self.confidence), 3)}


@dataclass
class Alignment:
    """How a baseline's names map onto a target's.

    Attributes
    ----------
    modules, nodes, tensors : list of Pair
        Module paths (as the ``module`` coordinate), raw node names, tensor labels.
    unpaired : dict
        ``{"baseline": [{"node", "why"}], "target": [...], "glue": [{"side", "node", "why"}]}``:
        what has no counterpart and is a real difference (baseline / target), and what has none
        but is not a difference (framework glue, organisation, not captured).
    frameworks : (str, str)
        Baseline and target frameworks.
    identical : bool
        Every name paired with itself (exact-name comparison is the special case).
    """

    modules: list[Pair] = field(default_factory=list)
    nodes: list[Pair] = field(default_factory=list)
    tensors: list[Pair] = field(default_factory=list)
    unpaired: dict[str, list[dict[str, str]]] = field(
        default_factory=lambda: {"baseline": [], "target": [], "glue": []})
    frameworks: tuple[str, str] = ("", "")
    identical: bool = False
    target_coords: dict[str, tuple[Any, ...]] = field(default_factory=dict, repr=False)
    sources: list[str] = field(default_factory=list)
    applied: bool = False  # the baseline is already in the target's names (a combined dataset)
    user_unpaired: list[str] = field(default_factory=list)  # target nodes a mapping said to leave unpaired
    mapping_problems: list[str] = field(default_factory=list)  # mapping pairs not kept (unknown names, ...), why

    ATTR = "precnb_alignment"
    """The attribute under which :func:`precnb.open_runs` records the alignment it applied."""

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, applied: bool = False) -> Alignment:
        """Rebuild from :meth:`to_dict` (``applied=True``: the baseline it describes is already renamed)."""
        def pairs(key: str) -> list[Pair]:
            return [Pair(p["baseline"], p["target"], p["how"], float(p["confidence"])) for p in d.get(key, [])]

        return cls(modules=pairs("modules"), nodes=pairs("nodes"), tensors=pairs("tensors"),
                   unpaired={k: list(v) for k, v in (d.get("unpaired") or {}).items()},
                   frameworks=tuple(d.get("frameworks") or ("", "")),
                   identical=bool(d.get("identical")), applied=applied)

    @classmethod
    def of(cls, ds: xr.Dataset) -> Alignment | None:
        """The alignment recorded on a combined dataset by :func:`precnb.open_runs` (None if there is none)."""
        raw = ds.attrs.get(cls.ATTR)
        if not raw:
            return None
        return cls.from_dict(json.loads(raw) if isinstance(raw, str) else raw, applied=True)

    # ------------------------------------------------------------------ views
    def tensor_map(self) -> dict[str, str]:
        """Target tensor label → baseline tensor label."""
        return {p.target: p.baseline for p in self.tensors}

    def node_map(self) -> dict[str, str]:
        """Target node → baseline node."""
        return {p.target: p.baseline for p in self.nodes}

    def module_map(self) -> dict[str, str]:
        """Target module path → baseline module path."""
        return {p.target: p.baseline for p in self.modules}

    def baseline_node(self, target_node: str | None) -> str | None:
        """The baseline's name of a target node (None when unpaired)."""
        return self.node_map().get(target_node or "")

    def baseline_module(self, target_module: str | None) -> str | None:
        """The baseline's path of a target module (None when unpaired)."""
        if not target_module:
            return None
        return self.module_map().get(target_module)

    def not_compared(self, side: str) -> set[str]:
        """Nodes of *side* that have no counterpart but are no difference (glue, organisation, not captured)."""
        return {g["node"] for g in self.unpaired.get("glue", []) if g["side"] == side}

    def set_aside(self, limit: int = 3) -> list[dict[str, Any]]:
        """What the alignment set aside as two codebases' own organisation, one entry per rule (``why``).

        The rules of :mod:`precnb.analysis.align.aside` (masks, identity calls, decompositions, ...). Each
        entry: ``why`` (the rule, without the node-specific detail), ``nodes`` (how many, per side),
        ``examples`` (a few ``{"side", "node", "why"}``), ``source`` = ``"alignment"``.
        """
        from precnb.analysis.align.aside import is_codebase_aside

        groups: dict[str, dict[str, Any]] = {}
        for g in self.unpaired.get("glue", []):
            why = str(g.get("why", ""))
            if not is_codebase_aside(why):
                continue
            key = why.split(" (", 1)[0]
            if key.startswith("organisation: inside ") or key.startswith("organisation: the backward of "):
                key = " ".join(key.split(" ")[:3])  # per rule, not per module
            elif key.startswith("organisation: its value is recorded"):
                key = "organisation: its value is recorded in the other run too"
            elif key.startswith("organisation: an intermediate step of "):
                key = "organisation: an intermediate step of an op the other run makes in one call"
            e = groups.setdefault(key, {"why": key, "source": "alignment", "nodes": {"baseline": 0, "target": 0},
                                        "examples": []})
            e["nodes"][str(g.get("side", "target"))] = e["nodes"].get(str(g.get("side", "target")), 0) + 1
            if len(e["examples"]) < limit:
                e["examples"].append({"side": g.get("side"), "node": g.get("node"), "why": why})
        return sorted(groups.values(), key=lambda e: -(e["nodes"]["baseline"] + e["nodes"]["target"]))

    def counts(self) -> dict[str, Any]:
        """Counts of pairs per kind and per ``how``, and of what is left."""
        out: dict[str, Any] = {}
        for kind in ("modules", "nodes", "tensors"):
            pairs = getattr(self, kind)
            out[kind] = {"paired": len(pairs), "by_how": dict(Counter(p.how for p in pairs))}
        out["unpaired"] = {"baseline": len(self.unpaired.get("baseline", [])),
                           "target": len(self.unpaired.get("target", [])),
                           "glue": len(self.unpaired.get("glue", []))}
        return out

    def least_confident(self, n: int = 10, kind: str = "nodes") -> list[Pair]:
        """The *n* least confident pairs of *kind* (``modules``, ``nodes`` or ``tensors``)."""
        return sorted(getattr(self, kind), key=lambda p: (p.confidence, p.target))[:n]

    def summary(self) -> dict[str, Any]:
        """Small JSON-ready digest (counts, frameworks, identical), for findings and the report."""
        c = self.counts()
        return {"frameworks": list(self.frameworks), "identical": self.identical,
                "modules_paired": c["modules"]["paired"], "nodes_paired": c["nodes"]["paired"],
                "tensors_paired": c["tensors"]["paired"], "by_how": c["nodes"]["by_how"],
                "unpaired": c["unpaired"], "sources": list(self.sources),
                "mapping_problems": list(self.mapping_problems)}

    def describe(self) -> str:
        """One sentence: how many nodes were paired and how."""
        if self.identical:
            return "names identical in both runs: every node paired by name"
        c = self.counts()
        how = ", ".join(f"{v} by {k}" for k, v in sorted(c["nodes"]["by_how"].items(), key=lambda kv: -kv[1]))
        u = c["unpaired"]
        if all(p.baseline == p.target for p in self.nodes):
            return (f"names match: {c['nodes']['paired']} nodes paired by name; {u['glue']} node(s) without "
                    f"counterpart are glue or organisation, {u['baseline']} baseline / {u['target']} target "
                    "node(s) are unpaired")
        return (f"names differ ({self.frameworks[0] or '?'} vs {self.frameworks[1] or '?'}): aligned "
                f"{c['modules']['paired']} modules and {c['nodes']['paired']} nodes ({how}); "
                f"{u['glue']} node(s) without counterpart are framework glue or organisation, "
                f"{u['baseline']} baseline / {u['target']} target node(s) are unpaired")

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract of ``precnb align --json``."""
        return {
            "schema": ALIGNMENT_SCHEMA,
            "modules": [p.to_dict() for p in self.modules],
            "nodes": [p.to_dict() for p in self.nodes],
            "tensors": [p.to_dict() for p in self.tensors],
            "unpaired": {k: list(v) for k, v in self.unpaired.items()},
            "counts": self.counts(),
            "frameworks": list(self.frameworks),
            "identical": self.identical,
            "mapping_problems": list(self.mapping_problems),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """Strict JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def mapping_document(self) -> dict[str, Any]:
        """Precnb's own mapping file content: every module and node pair (edit it, reuse it with ``mapping=``).

        Tensor pairs are listed only where they were set by hand (``how="user"``): the rest follow
        from the node pairs when the file is read back.
        """
        return {
            "schema": "precnb.mapping/1",
            "frameworks": {"baseline": self.frameworks[0], "target": self.frameworks[1]},
            "modules": [p.to_dict() for p in self.modules],
            "nodes": [p.to_dict() for p in self.nodes],
            "tensors": [p.to_dict() for p in self.tensors if p.how == "user"],
            "unpair": sorted(self.user_unpaired),
            "note": "precnb alignment: edit the pairs (baseline <-> target), delete wrong ones, add missing ones; "
                    "`precnb diff BASE TARGET --mapping THIS_FILE` keeps them and pairs the rest automatically",
        }

    def to_file(self, path: Any, *, overwrite: bool = False, inputs: Any = ()) -> Any:
        """Write :meth:`mapping_document` as precnb's mapping file (JSON) and return its path.

        The write follows :mod:`precnb._write`: atomic; an existing file is replaced only with
        ``overwrite=True`` and only when precnb wrote it; never inside *inputs* (the runs).
        """
        from precnb.mapping import save_mapping

        return save_mapping(self.mapping_document(), path, overwrite=overwrite, inputs=inputs)

    # ------------------------------------------------------------------ editing
    def with_pairs(self, *, set_nodes: dict[str, str] | None = None, unpair_targets: set[str] | None = None,
                   set_modules: dict[str, str] | None = None) -> dict[str, Any]:
        """The user pairs of this alignment plus the given edits, as mapping hints for a recompute.

        Parameters
        ----------
        set_nodes : dict, optional
            Baseline node → target node pairs to force.
        unpair_targets : set of str, optional
            Target nodes that must stay unpaired (added to those a mapping already left unpaired;
            a node given in *set_nodes* is paired again).
        set_modules : dict, optional
            Baseline module path → target module path pairs to force.

        Returns
        -------
        dict
            ``{"modules", "nodes", "tensors", "unpair"}`` (what :func:`precnb.align` takes as ``mapping``).
        """
        user_nodes = {p.baseline: p.target for p in self.nodes if p.how == "user"}
        user_mods = {p.baseline: p.target for p in self.modules if p.how == "user"}
        user_tensors = {p.baseline: p.target for p in self.tensors if p.how == "user"}
        for b, t in (set_nodes or {}).items():
            user_nodes = {k: v for k, v in user_nodes.items() if v != t}
            user_nodes[b] = t
        user_mods.update(set_modules or {})
        unpair = (set(self.user_unpaired) - set((set_nodes or {}).values())) | set(unpair_targets or ())
        user_nodes = {b: t for b, t in user_nodes.items() if t not in unpair}
        return {"modules": user_mods, "nodes": user_nodes, "tensors": user_tensors, "unpair": sorted(unpair)}

    # ------------------------------------------------------------------ applying
    def apply(self, baseline: xr.Dataset) -> xr.Dataset:
        """The baseline in the target's names: paired tensors renamed, glue dropped, the rest kept apart.

        Paired tensors take the target's label and tensor coordinates (node, module, api, ...); their
        ``dtype`` and ``shape`` stay the baseline's. Unpaired baseline tensors that are a real
        difference keep their own label (``" (baseline)"`` appended when a target label has it).
        Glue, organisation and not-captured tensors are dropped: they are not compared.

        Parameters
        ----------
        baseline : xarray.Dataset
            One run (the baseline this alignment was made for).

        Returns
        -------
        xarray.Dataset
        """
        if self.identical or self.applied:
            return baseline
        from precnb.analysis.compare.prep import alignment_key

        # the comparison and the pre-flight checks both rename the same baseline: once (a shallow copy each)
        return _APPLIED.get([baseline], ("apply", alignment_key(self)), lambda: self._apply(baseline),
                            copy=lambda ds: ds.copy(deep=False))

    def _apply(self, baseline: xr.Dataset) -> xr.Dataset:
        tmap = {p.baseline: p.target for p in self.tensors}
        # not compared: glue / organisation / not captured, and the tensors of a paired node that have
        # no counterpart in its partner (an extra output of one framework's op is no structural difference)
        skip = self.not_compared("baseline") | {p.baseline for p in self.nodes}
        labels = [str(x) for x in baseline["tensor"].values]
        nodes = baseline["node"].values
        targets = set(tmap.values())
        # a target node without counterpart can carry an unpaired baseline node's name (a shifted call counter:
        # another call): the baseline's keeps its own label, apart
        target_only = {str(u.get("node")) for u in self.unpaired.get("target", [])} | {
            str(g.get("node")) for g in self.unpaired.get("glue", []) if g.get("side") == "target"}
        keep: list[int] = []
        new: list[str] = []
        for j, lbl in enumerate(labels):
            if lbl in tmap:
                keep.append(j)
                new.append(tmap[lbl])
            elif str(nodes[j]) not in skip:
                keep.append(j)
                new.append(lbl if lbl not in targets and str(nodes[j]) not in target_only else f"{lbl} (baseline)")
        out = baseline.isel(tensor=keep)
        out = out.assign_coords(tensor=np.asarray(new, dtype=object))
        coord_vals = {name: np.asarray(out.coords[name].values).copy() for name in _COORDS if name in out.coords}
        given = [(k, tc) for k, tc in enumerate(map(self.target_coords.get, new)) if tc is not None]
        for i, name in enumerate(_COORDS):  # the renamed tensors' target coordinates, column by column
            if name in coord_vals and given:
                column = np.empty(len(given), dtype=object)  # each value as it is (no array of strings made first)
                column[:] = [tc[i] for _k, tc in given]
                coord_vals[name][[k for k, _tc in given]] = column
        out = out.assign_coords({name: ("tensor", vals) for name, vals in coord_vals.items()})
        raw = baseline.attrs.get("dtype_changes")  # entry dtypes follow their tensors' new labels
        if raw:
            table = json.loads(raw) if isinstance(raw, str) else raw
            moved = {}
            for lbl, v in table.items():
                if lbl in tmap:
                    moved[tmap[lbl]] = v
                elif lbl in labels and str(nodes[labels.index(lbl)]) not in skip:
                    moved[lbl if lbl not in targets else f"{lbl} (baseline)"] = v
            out.attrs = {**out.attrs, "dtype_changes": json.dumps(moved)}
        # per-entry module / parent / stack exceptions are relative to the baseline's own coordinates and
        # node names, which the target's replace here: kept only for a shape (the baseline's own coordinate stays),
        # under the tensor's new label (msprobe's counters shift after step 0: one label, another op's shape)
        meta = baseline.attrs.get("meta_changes")
        attrs = {k: v for k, v in out.attrs.items() if k not in ("meta_changes", "stack_changes", "shape_changes")}
        pos = {lbl: j for j, lbl in enumerate(labels)}

        def relabelled(table: dict[str, Any]) -> dict[str, Any]:
            return {tmap.get(lbl, lbl): v for lbl, v in table.items() if lbl in pos and (
                lbl in tmap or (lbl not in targets and str(nodes[pos[lbl]]) not in skip))}

        if meta:
            table = json.loads(meta) if isinstance(meta, str) else meta
            kept = relabelled(table.get("shape", {}))
            if kept:
                attrs["meta_changes"] = json.dumps({"shape": kept})
        shapes = baseline.attrs.get("shape_changes")
        if shapes:
            kept = relabelled(json.loads(shapes) if isinstance(shapes, str) else shapes)
            if kept:
                attrs["shape_changes"] = json.dumps(kept)
        out.attrs = attrs
        from precnb.analysis.undefined import returned_parameters

        # parameters a module returns as an output (whose records the renaming may drop), in the new names
        ret = [f"{n}.parameters.{p}" for n, ps in returned_parameters(baseline).items() for p in ps]
        out.attrs = {**out.attrs, "returned_parameters": json.dumps([tmap.get(lbl, lbl) for lbl in ret])}
        return out

    def target_view(self, target: xr.Dataset) -> xr.Dataset:
        """The target as compared.

        Without glue / organisation / not-captured nodes, nor the tensors of a paired node that have no
        counterpart.
        """
        if self.identical:
            return target
        skip = self.not_compared("target")
        paired_nodes = {p.target for p in self.nodes}
        paired = set(self.tensor_map())
        nodes = target["node"].values
        labels = target["tensor"].values
        # a merged tensor whose copies differ across its group is the target's own finding: kept unpaired
        departs = np.zeros(len(labels), bool)
        if "replicas_differ" in target.data_vars:
            from precnb.analysis.compare import proven_replicas

            departs = np.asarray(target["replicas_differ"].values, bool).any(axis=(0, 1)) & proven_replicas(target)
        keep = [j for j in range(target.sizes["tensor"]) if str(nodes[j]) not in skip
                and (str(labels[j]) in paired or str(nodes[j]) not in paired_nodes or departs[j])]
        if len(keep) == target.sizes["tensor"]:
            return target
        return target.isel(tensor=keep)

"""Side tables (construct.json, stack.json) merged across files, and the dataset attributes built from them.

Byte-identical tables arrive as one :class:`~precnb.io.records.SharedTable` and are parsed and
merged once; a parent that another (step, rank) gives the same node name (pipeline stages' local
names) goes to ``attrs["construct_ranks"]``, frames that differ to ``attrs["stack_changes"]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from precnb.io._assemble._base import _Rec
from precnb.io._assemble._coords import CoordsLayer
from precnb.io.records import SharedTable
from precnb.schema import SCHEMA_VERSION, encode_entry_changes, side_text


class SidesLayer(CoordsLayer):
    """Merging the side tables of the records and writing the dataset attributes."""

    def _side(self, table: dict[str, Any] | SharedTable) -> tuple[Any, Mapping[str, Any]]:
        if not isinstance(table, SharedTable):
            return None, table
        hit = self._side_cache.get(table.key)
        if hit is None:
            hit = self._side_cache[table.key] = table.get()
        return table.key, hit

    def _note_stacks(self, r: _Rec, diff: Mapping[str, Any] | None) -> None:
        """The (step, rank) of *r* holds the frames of *diff* (node → frames) where the merged table has others."""
        for node, frames in (diff or {}).items():
            variant = tuple(str(f) for f in frames) if isinstance(frames, list) else (str(frames),)
            self.stack_changes.setdefault(node, {}).setdefault(variant, []).append([r.step, r.rank])

    def _merge_sides(self, r: _Rec) -> None:
        for (key, table), name in ((r.construct, "construct"), (r.stacks, "stacks")):
            if key is not None:
                if key in self._merged:
                    if name == "construct":  # the same table again: its disagreements hold for this file too
                        at = f"{int(r.step)},{int(r.rank)}"
                        for node, val in self._exceptions.get(key, {}).items():
                            self.construct_ranks.setdefault(node, {})[at] = val
                    if name == "stacks" and not r.skipped:
                        self._note_stacks(r, self._stack_diff.get(key))
                    continue
                self._merged.add(key)
            target = getattr(self, name)
            if not target and key is not None and not self._borrowed.get(name):  # the first shared table: as is
                setattr(self, name, table)
                self._borrowed[name] = True
                continue
            if self._borrowed.get(name):  # a second table: merge into a copy of the one borrowed
                target = dict(target)
                setattr(self, name, target)
                self._borrowed[name] = False
            if name == "stacks" and target:  # what this table records otherwise than the merged one
                diff = {node: val for node, val in table.items()
                        if (old := target.get(node)) is not None and old != val}
                if key is not None:
                    self._stack_diff[key] = diff
                if not r.skipped:
                    self._note_stacks(r, diff)
            if name == "construct":  # a parent another (step, rank) gives the same node name: PP stages'
                ranks_of, at = self.construct_ranks, f"{int(r.step)},{int(r.rank)}"  # local names, cached ops
                mine = self._exceptions.setdefault(key, {}) if key is not None else {}
                for node, val in table.items():
                    have = target.setdefault(node, val)
                    if have != val and not node.startswith(("Module.", "Cell.")):  # calls: they hold tensors
                        ranks_of.setdefault(node, {})[at] = mine[node] = val
                continue
            for node, val in table.items():
                target.setdefault(node, val)

    def attrs(self, source_format: str, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Dataset attributes: schema version, format, side tables, task/level/framework."""
        meta: dict[str, Any] = {
            "precnb_schema": SCHEMA_VERSION,
            "source_format": source_format,
            "construct": side_text(self.construct),  # the text other code writes too (concat_steps, merge)
            "stacks": side_text(self.stacks),
        }
        for key in ("task", "level", "framework"):
            vals = self._meta[key]
            if key == "framework" and len(vals) > 1:
                vals = vals - {"unknown"}  # a file without framework evidence says nothing against the others
            meta[key] = ",".join(sorted(vals))
        if self.dtype_changes:
            meta["dtype_changes"] = json.dumps(self.dtype_changes)
        if self.shape_changes:
            meta["shape_changes"] = encode_entry_changes(self.shape_changes)
        if self.construct_ranks:  # read with precnb.analysis.layout.pp (stage-local names of pipeline stages)
            meta["construct_ranks"] = json.dumps({
                n: dict(sorted(by.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(","))))
                for n, by in sorted(self.construct_ranks.items())})
        if self.meta_changes:
            meta["meta_changes"] = json.dumps(self.meta_changes)
        if self.stack_changes:
            meta["stack_changes"] = json.dumps({node: [[list(frames), where] for frames, where in variants.items()]
                                                for node, variants in self.stack_changes.items()})
        meta.update(self.facts.attrs())
        meta.update(attrs or {})
        return meta

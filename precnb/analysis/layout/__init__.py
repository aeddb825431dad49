"""Parallel layouts: rank ↔ (tp, cp, ep, dp, pp) coordinates, Megatron order semantics.

Megatron's order string lists the parallel dimensions from the fastest-varying to the
slowest: with ``order="tp-cp-ep-dp-pp"``, consecutive ranks form a TP group, and the
pipeline stage changes slowest. Expert parallelism splits the data-parallel dimension
(``ep`` varies faster than the remaining expert-data-parallel part), as in Megatron's
``RankGenerator``.

The layout family: this module (:class:`Layout`), :mod:`~precnb.analysis.layout.infer` (a run's layout
read from its dumps, a given one checked against them), and turning sharded ranks into whole-model ranks:
:mod:`~precnb.analysis.layout.merge` (TP / CP / DP shards merged into whole-layer statistics),
:mod:`~precnb.analysis.layout.shard_shapes` (the whole shapes of split tensors read from the run),
:mod:`~precnb.analysis.layout.pp` (PP / VPP / EP relabelling, with
:mod:`~precnb.analysis.layout.pp_stitch` and :mod:`~precnb.analysis.layout.pp_tree`).

Examples
--------
>>> lay = Layout(8, tp=2, pp=2)
>>> lay.dp
2
>>> lay.coords(5)
{'tp': 1, 'cp': 0, 'ep': 0, 'dp': 0, 'pp': 1}
>>> lay.groups("tp")[:2]
[[0, 1], [2, 3]]
>>> lay.groups("pp")[0]
[0, 4]
>>> Layout.parse("tp=2,pp=2", world_size=8) == lay
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from itertools import product

__all__ = ["DIM_NAMES", "Layout", "LayoutError"]

DIM_NAMES = ("tp", "cp", "ep", "dp", "pp")


class LayoutError(ValueError):
    """An impossible parallel layout (sizes that do not divide the world size, ...)."""


@dataclass(frozen=True)
class Layout:
    """A Megatron-style parallel layout.

    Parameters
    ----------
    world_size : int
    tp, pp, vpp, cp, ep : int
        Tensor, pipeline, virtual-pipeline (model chunks per stage), context and expert
        parallel sizes. ``dp`` is derived: ``world_size / (tp * cp * pp)``.
    order : str
        Megatron order string, fastest-varying first (default ``"tp-cp-ep-dp-pp"``).
    num_layers : int, optional
        Total transformer layers, for PP/VPP renumbering (inferred from the dump otherwise).
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = "tp-cp-ep-dp-pp"
    num_layers: int | None = None

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "pp", "vpp", "cp", "ep"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise LayoutError(f"{name} must be a positive integer, got {v!r}")
        model = self.tp * self.cp * self.pp
        if self.world_size % model:
            raise LayoutError(
                f"world size {self.world_size} is not divisible by tp×cp×pp = "
                f"{self.tp}×{self.cp}×{self.pp} = {model}")
        dp = self.world_size // model
        if dp % self.ep:
            raise LayoutError(f"ep={self.ep} must divide the data-parallel size dp={dp}")
        dims = self.order.split("-")
        if sorted(dims) != sorted(DIM_NAMES):
            raise LayoutError(f"order {self.order!r} must name each of {', '.join(DIM_NAMES)} once")
        if self.num_layers is not None and self.num_layers % (self.pp * self.vpp):
            raise LayoutError(f"num_layers={self.num_layers} is not divisible by pp×vpp={self.pp * self.vpp}")

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, *, world_size: int) -> Layout:
        """Parse ``"tp=2,pp=2,order=tp-cp-ep-dp-pp"`` (keys: tp pp vpp cp ep dp order num_layers).

        ``dp`` may be given to check the world size.
        """
        kw: dict[str, object] = {}
        dp = None
        for part in filter(None, (p.strip() for p in re.split(r"[,\s]+", text))):
            if "=" not in part:
                raise LayoutError(f"layout item {part!r} is not KEY=VALUE (e.g. tp=2)")
            key, val = (s.strip() for s in part.split("=", 1))
            if key == "order":
                kw["order"] = val
                continue
            if key not in ("tp", "pp", "vpp", "cp", "ep", "dp", "num_layers", "world_size"):
                raise LayoutError(f"unknown layout key {key!r}")
            try:
                num = int(val)
            except ValueError:
                raise LayoutError(f"layout {key}={val!r} is not an integer") from None
            if key == "dp":
                dp = num
            elif key == "world_size":
                world_size = num
            else:
                kw[key] = num
        lay = cls(world_size, **kw)  # type: ignore[arg-type]
        if dp is not None and dp != lay.dp:
            raise LayoutError(f"dp={dp} but world size {world_size} with tp×cp×pp gives dp={lay.dp}")
        return lay

    # -- sizes -------------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel size (including the expert-parallel split)."""
        return self.world_size // (self.tp * self.cp * self.pp)

    def size(self, dim: str) -> int:
        """Size of a parallel dimension."""
        if dim == "dp":
            return self.dp // self.ep  # the part of dp that varies slower than ep
        return int(getattr(self, dim))

    def _dims(self) -> list[str]:
        return self.order.split("-")

    # -- rank mapping --------------------------------------------------------------------------
    def _raw(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world size {self.world_size}")
        out: dict[str, int] = {}
        rest = rank
        for d in self._dims():
            n = self.size(d)
            out[d] = rest % n
            rest //= n
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Parallel coordinates of *rank* (``dp`` is the full data-parallel index)."""
        out = self._raw(rank)
        # full dp index: ep is the fast part of the data-parallel dimension
        out["dp"] = out["dp"] * self.ep + out["ep"]
        return {d: out[d] for d in DIM_NAMES}

    def rank_of(self, **coords: int) -> int:
        """Inverse of :meth:`coords` (missing coordinates are 0)."""
        c = {d: int(coords.get(d, 0)) for d in DIM_NAMES}
        c["ep"], c["dp"] = c["dp"] % self.ep, c["dp"] // self.ep
        rank, mult = 0, 1
        for d in self._dims():
            n = self.size(d)
            if not 0 <= c[d] < n:
                raise LayoutError(f"{d}={c[d]} outside 0..{n - 1}")
            rank += c[d] * mult
            mult *= n
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """Rank groups along *dim* (ranks that differ only in that coordinate)."""
        if dim not in DIM_NAMES:
            raise LayoutError(f"unknown dimension {dim!r}")
        seen: dict[tuple[int, ...], list[int]] = {}
        for r in range(self.world_size):
            c = self._raw(r)
            key = tuple(c[k] for k in DIM_NAMES if k != dim and not (dim == "dp" and k == "ep"))
            seen.setdefault(key, []).append(r)
        return sorted(seen.values())

    def reduced(self, *dims: str) -> Layout:
        """The layout with the given dimensions merged away (size 1)."""
        def size(d: str) -> int:  # merging pp away merges its virtual stages too (dp away: its ep split)
            return 1 if d in dims or (d == "vpp" and "pp" in dims) or (d == "ep" and "dp" in dims) \
                else int(getattr(self, d))

        shrink = 1
        for d in dims:
            if d in ("tp", "pp", "cp") or (d == "ep" and "dp" not in dims):
                shrink *= getattr(self, d)
            elif d == "dp":  # the data-parallel replicas merged into one (ep splits dp: it goes too)
                shrink *= self.dp
        return replace(self, world_size=self.world_size // shrink, num_layers=None, tp=size("tp"), pp=size("pp"),
                       vpp=size("vpp"), cp=size("cp"), ep=size("ep"))

    def describe(self) -> str:
        """One line, e.g. ``world 8 = tp2 × cp1 × pp2 × dp2 (ep1, vpp1)``."""
        return (f"world {self.world_size} = tp{self.tp} × cp{self.cp} × pp{self.pp} × dp{self.dp} "
                f"(ep{self.ep}, vpp{self.vpp}), order {self.order}")

    def table(self) -> list[dict[str, int]]:
        """One row per rank with its coordinates."""
        return [{"rank": r, **self.coords(r)} for r in range(self.world_size)]

    def check_groups(self, recorded: list[list[int]]) -> list[str]:
        """Problems between recorded communication groups and this layout (empty = consistent).

        Each recorded group (``group_ranks`` of a collective in the dump) must be a group of this
        layout along some dimension or combination, or the whole world.
        """
        known = {tuple(range(self.world_size))}
        for d in DIM_NAMES:
            known |= {tuple(g) for g in self.groups(d)}
        # combined data-parallel groups (dp × cp, used for gradient all-reduce with CP)
        if self.cp > 1:
            seen: dict[tuple[int, ...], list[int]] = {}
            for r in range(self.world_size):
                c = self._raw(r)
                seen.setdefault((c["tp"], c["pp"]), []).append(r)
            known |= {tuple(sorted(v)) for v in seen.values()}
        problems = []
        for g in recorded:
            if tuple(sorted(g)) not in known:
                problems.append(f"recorded group {sorted(g)} is not a {'/'.join(DIM_NAMES)} group of {self.describe()}")
        return problems

    @classmethod
    def infer(cls, world_size: int, recorded: list[list[int]]) -> Layout:
        """Guess (tp, pp) from recorded communication groups.

        Among the layouts that explain every recorded group, the one with the largest TP size
        equal to a recorded group's size wins; with no usable group, pure data parallelism.

        Examples
        --------
        >>> Layout.infer(4, [[0, 1], [2, 3]]).tp
        2
        """
        sizes = {len(g) for g in recorded if 1 < len(g) < world_size}
        fits = [lay for lay in cls.all_sizes(world_size) if not lay.check_groups(recorded)]
        ranked = sorted((lay for lay in fits if lay.tp in sizes), key=lambda lay: (-lay.tp, lay.pp))
        return ranked[0] if ranked else cls(world_size)

    @staticmethod
    def all_sizes(world_size: int) -> list[Layout]:
        """Every (tp, pp) layout of a world size (for guessing)."""
        out = []
        for tp, pp in product(range(1, world_size + 1), repeat=2):
            if world_size % (tp * pp) == 0:
                out.append(Layout(world_size, tp=tp, pp=pp))
        return out

"""Parallel layouts: rank ↔ (tp, cp, ep, dp, pp) coordinates, Megatron order semantics.

Megatron's order string lists the parallel dimensions from the fastest-varying to the
slowest: with ``order="tp-cp-ep-dp-pp"``, consecutive ranks form a TP group, and the
pipeline stage changes slowest.

A layout is two decompositions of the same world, as Megatron-Core's
``initialize_model_parallel`` builds them (two ``RankGenerator`` s over one order):

* the **dense** one, TP × CP × DP × PP (with VPP), for attention, dense MLPs, norms and routers:
  ``dp = world / (tp·cp·pp)``;
* the **expert** one, ETP × EP × EDP × PP, for the experts of MoE layers: ``edp = world / (etp·ep·pp)``, no CP.
  ``etp`` defaults to ``tp`` (Megatron's default). EP is *folded* onto the dense dimensions: with
  ``tp=2, ep=2, etp=1`` on two ranks the expert groups lie over the TP group's ranks ("MoE parallel
  folding"); with ``tp=1, dp=2, ep=2`` over the data-parallel ranks.

The layout family: this module (:class:`Layout`), :mod:`~precnb.analysis.layout.infer` (a run's layout
read from its dumps, a given one checked against them), and turning sharded ranks into whole-model ranks:
:mod:`~precnb.analysis.layout.merge` (TP / CP / DP shards merged into whole-layer statistics),
:mod:`~precnb.analysis.layout.shard_shapes` (the whole shapes of split tensors read from the run),
:mod:`~precnb.analysis.layout.pp` (PP / VPP stitching, local expert indices made global, with
:mod:`~precnb.analysis.layout.pp_stitch` and :mod:`~precnb.analysis.layout.pp_tree`), and
:mod:`~precnb.analysis.layout.rank_args` (tensor-parallel glue: ops whose rank-dependent constants make their
outputs differ by design; the merge classifies them, the replica check, the comparison and the aligner set
them aside).

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

MoE parallel folding: two ranks form the TP group of the dense layers and the EP group of the experts.

>>> moe = Layout.parse("tp=2,ep=2,etp=1", world_size=2)
>>> moe.groups("tp"), moe.groups("ep"), moe.expert_coords(1)
([[0, 1]], [[0, 1]], {'etp': 0, 'ep': 1, 'edp': 0, 'pp': 0})
>>> Layout(2, tp=2, ep=2).etp  # etp = tp needs tp·ep·pp = 4 ranks: the only layout Megatron allows here
1
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any

__all__ = ["DIM_NAMES", "EXPERT_DIMS", "Layout", "LayoutError"]

DIM_NAMES = ("tp", "cp", "ep", "dp", "pp")
EXPERT_DIMS = ("etp", "ep", "edp", "pp")


class LayoutError(ValueError):
    """An impossible parallel layout (sizes that do not divide the world size, ...)."""


@dataclass(frozen=True)
class Layout:
    """A Megatron-style parallel layout (dense and expert decompositions of one world).

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
    etp : int, optional
        Expert tensor-parallel size. Default: ``tp`` as in Megatron; when ``tp·ep·pp`` does not divide the
        world but ``ep·pp`` does (EP folded onto TP), 1 — and :attr:`etp_assumed` says so.
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = "tp-cp-ep-dp-pp"
    num_layers: int | None = None
    etp: int | None = None
    etp_assumed: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "pp", "vpp", "cp", "ep"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LayoutError(f"{name} must be a positive integer, got {v!r}")
        model = self.tp * self.cp * self.pp
        if self.world_size % model:
            raise LayoutError(
                f"world size {self.world_size} is not divisible by tp×cp×pp = "
                f"{self.tp}×{self.cp}×{self.pp} = {model}")
        dims = self.order.split("-")
        if sorted(dims) != sorted(DIM_NAMES):
            raise LayoutError(f"order {self.order!r} must name each of {', '.join(DIM_NAMES)} once")
        if self.num_layers is not None and self.num_layers % (self.pp * self.vpp):
            raise LayoutError(f"num_layers={self.num_layers} is not divisible by pp×vpp={self.pp * self.vpp}")
        self._resolve_etp()

    def _resolve_etp(self) -> None:
        """``etp`` as Megatron-Core's ``initialize_model_parallel`` decides and checks it."""
        etp, note = self.etp, ""
        if etp is None:
            etp = self.tp
            w, ep_pp = self.world_size, self.ep * self.pp
            if self.ep > 1 and w % (etp * ep_pp) and not w % ep_pp:
                etp, note = 1, (f"etp=1 assumed: Megatron's default etp=tp={self.tp} needs tp×ep×pp = "
                                f"{self.tp * ep_pp} to divide world {w}; give etp= to change it")
        if not isinstance(etp, int) or isinstance(etp, bool) or etp < 1:
            raise LayoutError(f"etp must be a positive integer, got {etp!r}")
        size = etp * self.ep * self.pp
        if self.world_size % size:  # Megatron's own rule and words
            raise LayoutError(f"world_size ({self.world_size}) is not divisible by "
                              f"expert_tensor_model_pipeline_parallel size etp×ep×pp = "
                              f"{etp}×{self.ep}×{self.pp} = {size}")
        edp = self.world_size // size
        if not (self.order.endswith("pp") or self.pp == 1 or edp == self.dp):
            raise LayoutError("when not using pp-last rank ordering, the data parallel size of the attention and moe "
                              f"layers must be the same (dp={self.dp}, edp={edp}, order {self.order})")
        object.__setattr__(self, "etp", etp)
        object.__setattr__(self, "etp_assumed", note)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, *, world_size: int) -> Layout:
        """Parse ``"tp=2,pp=2,order=tp-cp-ep-dp-pp"`` (keys: tp pp vpp cp ep etp dp edp order num_layers).

        ``dp`` and ``edp`` may be given to check the world size.
        """
        kw: dict[str, object] = {}
        checks: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in re.split(r"[,\s]+", text))):
            if "=" not in part:
                raise LayoutError(f"layout item {part!r} is not KEY=VALUE (e.g. tp=2)")
            key, val = (s.strip() for s in part.split("=", 1))
            if key == "order":
                kw["order"] = val
                continue
            if key not in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "edp", "num_layers", "world_size"):
                raise LayoutError(f"unknown layout key {key!r}")
            try:
                num = int(val)
            except ValueError:
                raise LayoutError(f"layout {key}={val!r} is not an integer") from None
            if key in ("dp", "edp"):
                checks[key] = num
            elif key == "world_size":
                world_size = num
            else:
                kw[key] = num
        lay = cls(world_size, **kw)  # type: ignore[arg-type]
        if "dp" in checks and checks["dp"] != lay.dp:
            raise LayoutError(f"dp={checks['dp']} but world size {world_size} with tp×cp×pp gives dp={lay.dp}")
        if "edp" in checks and checks["edp"] != lay.edp:
            raise LayoutError(f"edp={checks['edp']} but world size {world_size} with etp×ep×pp gives edp={lay.edp}")
        return lay

    @classmethod
    def coerce(cls, spec: Any, world_size: int) -> Layout | None:
        """A layout from what a front end holds: a Layout, ``"tp=2,pp=2"``, ``{"tp": 2}`` or nothing (None).

        The one conversion every front end (CLI, explorer, ``diagnose``) uses.

        >>> Layout.coerce("tp=2,ep=2", 2).describe()
        'world 2 = tp2 × cp1 × pp1 × dp1 (ep2, vpp1), experts etp1 × ep2 × edp1, order tp-cp-ep-dp-pp'
        >>> Layout.coerce({"tp": 2}, 4) == Layout(4, tp=2), Layout.coerce("", 4)
        (True, None)
        """
        from collections.abc import Mapping

        if spec is None or (isinstance(spec, str) and not spec.strip()):
            return None
        if isinstance(spec, Layout):
            return spec
        if isinstance(spec, Mapping):
            return cls(int(world_size), **dict(spec))
        return cls.parse(str(spec), world_size=int(world_size))

    @property
    def sharded(self) -> bool:
        """Whether the layout splits the model (tp, pp, vpp, cp or ep above 1); data parallelism alone does not.

        >>> Layout(4).sharded, Layout(4, tp=2).sharded, Layout(2, ep=2).sharded
        (False, True, True)
        """
        return any(getattr(self, d) > 1 for d in ("tp", "pp", "vpp", "cp", "ep"))

    # -- sizes -------------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel size of the dense layers."""
        return self.world_size // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        """Expert data-parallel size: the replicas of each expert."""
        return self.world_size // (int(self.etp or 1) * self.ep * self.pp)

    @property
    def has_experts(self) -> bool:
        """Whether the expert decomposition differs from the dense one (ep > 1 or etp ≠ tp)."""
        return self.ep > 1 or self.etp != self.tp

    def size(self, dim: str) -> int:
        """Size of a parallel dimension (dense ``tp cp dp pp vpp``, expert ``etp ep edp``)."""
        if dim == "dp":
            return self.dp
        if dim == "edp":
            return self.edp
        return int(getattr(self, dim))

    def _dims(self) -> list[str]:
        return self.order.split("-")

    # -- rank mapping --------------------------------------------------------------------------
    def _sizes(self, expert: bool) -> dict[str, int]:
        """Sizes along the order's names for one of the two rank generators (Megatron: ep=1 dense, cp=1 expert)."""
        if expert:
            return {"tp": int(self.etp or 1), "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}
        return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}

    def _raw(self, rank: int, expert: bool = False) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world size {self.world_size}")
        sizes = self._sizes(expert)
        out: dict[str, int] = {}
        rest = rank
        for d in self._dims():
            out[d] = rest % sizes[d]
            rest //= sizes[d]
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Parallel coordinates of *rank*: dense ``tp cp dp pp`` and its expert-parallel rank ``ep``."""
        out = self._raw(rank)
        out["ep"] = self._raw(rank, expert=True)["ep"]
        return {d: out[d] for d in DIM_NAMES}

    def expert_coords(self, rank: int) -> dict[str, int]:
        """Coordinates of *rank* in the expert decomposition: ``etp ep edp pp``."""
        raw = self._raw(rank, expert=True)
        return {"etp": raw["tp"], "ep": raw["ep"], "edp": raw["dp"], "pp": raw["pp"]}

    def rank_of(self, **coords: int) -> int:
        """Inverse of :meth:`coords` over the dense coordinates (missing ones are 0; ``ep`` is not needed)."""
        c = {d: int(coords.get(d, 0)) for d in DIM_NAMES}
        sizes = self._sizes(False)
        rank, mult = 0, 1
        for d in self._dims():
            if d == "ep":
                continue
            if not 0 <= c[d] < sizes[d]:
                raise LayoutError(f"{d}={c[d]} outside 0..{sizes[d] - 1}")
            rank += c[d] * mult
            mult *= sizes[d]
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """Rank groups along *dim* (ranks that differ only in that coordinate).

        Dense dimensions ``tp cp dp pp``; expert dimensions ``ep etp edp`` (Megatron's expert groups).
        """
        if dim not in DIM_NAMES and dim not in EXPERT_DIMS:
            raise LayoutError(f"unknown dimension {dim!r}")
        expert = dim in ("ep", "etp", "edp")
        axis = {"etp": "tp", "edp": "dp"}.get(dim, dim)
        seen: dict[tuple[int, ...], list[int]] = {}
        for r in range(self.world_size):
            c = self._raw(r, expert)
            key = tuple(c[k] for k in DIM_NAMES if k != axis)
            seen.setdefault(key, []).append(r)
        return sorted(seen.values())

    def expert_owner(self, rank: int, local: int, experts_per_rank: int) -> int:
        """Global index of local expert *local* on *rank*: ``ep_rank · experts_per_rank + local``.

        >>> Layout(2, tp=2, ep=2).expert_owner(1, 0, 2)
        2
        """
        return self.expert_coords(rank)["ep"] * experts_per_rank + local

    def reduced(self, *dims: str) -> Layout:
        """The layout with the given dimensions merged away (size 1).

        Merging ``ep`` away keeps the dense ranks (each rank then holds its experts under their global
        indices); merging ``tp`` away merges the expert tensor-parallel split too when ``etp = tp``.
        """
        def size(d: str) -> int:  # merging pp away merges its virtual stages too
            return 1 if d in dims or (d == "vpp" and "pp" in dims) else int(getattr(self, d))

        shrink = 1
        for d in dims:
            if d in ("tp", "pp", "cp"):
                shrink *= getattr(self, d)
            elif d == "dp":
                shrink *= self.dp
        world = self.world_size // shrink
        ep = size("ep")
        etp = int(self.etp or 1)
        etp = 1 if ("tp" in dims and etp == self.tp) or "ep" in dims else etp
        etp = etp if world % (etp * ep * size("pp")) == 0 else 1
        ep = ep if world % (etp * ep * size("pp")) == 0 else 1
        return replace(self, world_size=world, num_layers=None, tp=size("tp"), pp=size("pp"),
                       vpp=size("vpp"), cp=size("cp"), ep=ep, etp=etp)

    def describe(self) -> str:
        """One line, e.g. ``world 8 = tp2 × cp1 × pp2 × dp2 (ep1, vpp1)``; experts when they are laid out apart.

        >>> Layout(2, tp=2, ep=2, etp=1).describe()
        'world 2 = tp2 × cp1 × pp1 × dp1 (ep2, vpp1), experts etp1 × ep2 × edp1, order tp-cp-ep-dp-pp'
        """
        experts = f", experts etp{self.etp} × ep{self.ep} × edp{self.edp}" if self.has_experts else ""
        return (f"world {self.world_size} = tp{self.tp} × cp{self.cp} × pp{self.pp} × dp{self.dp} "
                f"(ep{self.ep}, vpp{self.vpp}){experts}, order {self.order}")

    def table(self) -> list[dict[str, int]]:
        """One row per rank with its coordinates (and its expert coordinates when experts are laid out apart)."""
        if self.has_experts:
            return [{"rank": r, **self.coords(r), **{f"expert_{k}": v for k, v in self.expert_coords(r).items()
                                                      if k != "pp"}} for r in range(self.world_size)]
        return [{"rank": r, **self.coords(r)} for r in range(self.world_size)]

    def check_groups(self, recorded: list[list[int]]) -> list[str]:
        """Problems between recorded communication groups and this layout (empty = consistent).

        Each recorded group (``group_ranks`` of a collective in the dump) must be a group of this
        layout along some dimension or combination, or the whole world.
        """
        known = {tuple(range(self.world_size))}
        for d in (*DIM_NAMES, "etp", "edp"):
            known |= {tuple(g) for g in self.groups(d)}
        if self.has_experts:  # Megatron's expert model-parallel group (etp × ep of one stage and expert replica)
            moe: dict[tuple[int, int], list[int]] = {}
            for r in range(self.world_size):
                e = self.expert_coords(r)
                moe.setdefault((e["edp"], e["pp"]), []).append(r)
            known |= {tuple(sorted(v)) for v in moe.values()}
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

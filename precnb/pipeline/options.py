"""The triage options: the loading and pairing settings, and each diagnosis's own options routed to it.

The command line, the report, the explorer, the notebook templates and ``ds.prec`` all build
an :class:`Options` and hand it to :func:`precnb.diagnose`; none of them has a default of its
own. :data:`DEFAULTS` is the single statement of the defaults. A keyword that is not a field of
:class:`Options` goes to the diagnoses that declare it (their :attr:`~precnb.analysis.registry.Diagnosis.options`
dataclass, which holds its default); an unknown one is a TypeError listing the valid ones.

Examples
--------
>>> from precnb.pipeline.options import Options
>>> Options().step_offset is None    # 0 when both runs hold the same steps, else "auto"
True
>>> Options(target_layout="tp=2").describe()["target_layout"]
'tp=2'
>>> Options(replica_rtol=1e-3).of("replica_mismatch").replica_rtol   # routed to the replica check
0.001
>>> Options(limit=5).of("anomaly").limit, Options(limit=5).of("loss_spike").limit   # to each diagnosis declaring it
(5, 5)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, Literal

__all__ = ["DEFAULTS", "Options"]


@dataclass(frozen=True, init=False, eq=False)
class Options:
    """What the pipeline does, and how.

    Attributes
    ----------
    target_layout, baseline_layout : str, mapping or precnb.Layout, optional
        Parallel layout of each run (``"tp=2,pp=2"``): its shards are merged into whole-layer
        statistics before comparing, and the target's replicas are checked.
    layouts : mapping of run name to layout, optional
        The same by run name (``{"tp8": "tp=8"}``, for runs given as ``{name: run}`` or combined);
        the input model (:func:`precnb.pipeline.inputs.normalize`) gives each run its layout, and the
        triage's options then name them by role.
    step_offset : int, "auto" or None
        Target step = baseline step + offset. None: 0 when both runs hold the same step numbers,
        else "auto" (detected from parameter statistics).
    tolerance : precnb.Tolerance or float, optional
        How far statistics may differ (a float is one relative tolerance for every tensor);
        default by dtype (bf16 2^-8, fp16 2^-11, fp32 2^-14), calibrated by *reference*.
    reference : (run, run), optional
        Two healthy runs of the same job: per-tensor tolerances are calibrated from them.
    mapping : path, mapping, Alignment or a sequence of them, optional
        Name mapping files (msprobe layer/cell/API/data mapping YAML, precnb's own mapping
        file) or a ready :class:`precnb.Alignment`; names that differ are aligned automatically
        without any.
    steps, ranks : sequence of int, optional
        Load and diagnose only these (baseline step numbers for two runs).
    kinds : sequence of str, optional
        Run only these diagnoses (finding kinds, see :func:`precnb.analysis.registry.kinds`);
        default every diagnosis that applies.
    crc : {"report", "strict"}
        CRC differences with identical statistics: reported apart, or counted as divergence.
    format : str, optional
        Force a reader instead of detecting it.
    workers : int, "auto" or None
        Local parse processes (None: ``$PRECNB_WORKERS``, else "auto").
    client : distributed.Client, optional
        Parse on this dask cluster.
    progress : bool, optional
        Progress bars on/off (default: on for long loads, on a terminal).
    rank_table : path or mapping, optional
        Which host and device served each rank (an HCCL ``rank_table_file`` JSON, a
        ``rank,host,device`` CSV, or ``{rank: (host, device)}``): every finding naming a rank names
        them too (:mod:`precnb.pipeline.devices`). Stays here: a loading setting, read beside the runs
        and applied to every diagnosis's finding, not one diagnosis's option.
    tensor_metrics : bool or None
        Read the tensor files of a pair and compute whole-tensor metrics (msprobe compare's) where both
        runs saved the tensors (``task: tensor``): the plan reads such a pair whole, the first divergence
        judges on them, the report and the explorer show them. None: whenever both runs hold tensor files
        and no layout is given; False: statistics only. Stays here: a loading and pairing setting (it
        decides how the plan reads the pair; the pipeline computes the metrics once for every consumer).
    Diagnosis options
        Any other keyword: an option of the diagnoses that declare it (``limit``, how many further suspects a
        finding lists, of the anomaly search, the replica check and the loss-spike diagnosis alike;
        ``replica_rtol``, ``rng_regions``, ``replica_baseline`` of the replica check; ``spike_z``, ``spike_ratio``,
        ``spike_stats`` of the anomaly search; ``monitor``, ``loss`` of the loss-spike diagnosis; see
        :func:`precnb.analysis.options.option_owners`), read as an attribute or by kind with :meth:`of`; a name
        several diagnoses declare reaches each of them.
    """

    target_layout: Any = None
    baseline_layout: Any = None
    layouts: Mapping[str, Any] | None = None
    step_offset: int | Literal["auto"] | None = None
    tolerance: Any = None
    reference: Any = None
    mapping: Any = None
    steps: Sequence[int] | None = None
    ranks: Sequence[int] | None = None
    kinds: Sequence[str] | None = None
    crc: Literal["report", "strict"] = "report"
    format: str | None = None
    workers: int | str | None = None
    client: Any = field(default=None, compare=False)
    progress: bool | None = None
    tensor_metrics: bool | None = None  # issue #17 (precnb.pipeline.tensors)
    rank_table: Any = None  # issue #28 (precnb.pipeline.devices)

    def __init__(self, **kw: Any) -> None:
        own = {f.name: f for f in fields(self)}
        routed = _route({k: kw.pop(k) for k in list(kw) if k not in own}, set(own))
        for name, f in own.items():
            object.__setattr__(self, name, kw[name] if name in kw else _default(f))
        object.__setattr__(self, "_routed", routed)

    def __getattr__(self, name: str) -> Any:
        """A diagnosis option as given, else its default (``opts.replica_rtol``)."""
        if name.startswith("_"):
            raise AttributeError(name)
        routed = self.__dict__.get("_routed", {})
        if name in routed:
            return routed[name]
        from precnb.analysis.options import option_fields

        f = option_fields().get(name)
        if f is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return _default(f)

    def of(self, kind: str) -> Any:
        """The options of the diagnosis of *kind*: its options dataclass with the keywords given that it declares."""
        from precnb.analysis.registry import get

        cls = get(kind).options
        if cls is None:
            raise KeyError(f"the diagnosis {kind!r} declares no options")
        return cls(**{f.name: self._routed[f.name] for f in fields(cls) if f.name in self._routed})

    def by_kind(self) -> dict[str, Any]:
        """Every registered diagnosis's options by kind (those that declare some): :attr:`Context.options`."""
        from precnb.analysis.registry import diagnoses

        return {d.kind: self.of(d.kind) for d in diagnoses() if d.options is not None}

    def _compared(self) -> tuple[Any, ...]:
        """What equality and hashing look at: own fields compared by value, diagnosis options not at their default."""
        own = tuple(getattr(self, f.name) for f in fields(self) if f.compare)
        if not self._routed:
            return (*own, ())
        from precnb.analysis.options import option_fields

        known = option_fields()
        given = tuple(sorted((k, v) for k, v in self._routed.items()
                             if known[k].compare and not _same(v, _default(known[k]))))
        return (*own, given)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Options):
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())

    @classmethod
    def from_kwargs(cls, **kw: Any) -> Options:
        """Build from keyword arguments, rejecting unknown names with a clear message.

        ``layout`` is accepted as an alias of ``target_layout``.

        Raises
        ------
        TypeError
            For an unknown option.
        """
        if "layout" in kw:
            alias = kw.pop("layout")
            if alias is not None:
                if kw.get("target_layout") not in (None, alias):
                    raise TypeError("layout and target_layout name the same option; give one")
                kw["target_layout"] = alias
        return cls(**kw)

    def with_(self, **kw: Any) -> Options:
        """A copy with some options changed."""
        return type(self)(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **self._routed, **kw})

    def describe(self) -> dict[str, Any]:
        """JSON-ready view of the options that differ from :data:`DEFAULTS` (plus the essentials)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "client":
                continue
            v = getattr(self, f.name)
            if v == getattr(DEFAULTS, f.name) and f.name not in ("step_offset", "crc"):
                continue
            out[f.name] = _plain(v)
        if self._routed:
            from precnb.analysis.options import option_fields

            known = option_fields()
            for name, v in self._routed.items():
                if not known[name].compare:  # data or a path: never compared by value
                    if v is not None:
                        out[name] = _source(v)
                elif not _same(v, _default(known[name])):
                    out[name] = _plain(v)
        return out


def _default(f: Field[Any]) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _route(extra: dict[str, Any], own: set[str]) -> dict[str, Any]:
    """The keywords that are not fields of :class:`Options`, checked against the diagnoses' options."""
    if not extra:
        return {}
    from precnb.analysis.options import option_owners

    known = option_owners()
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}; known: {sorted(own | set(known))}")
    return extra


def _source(v: Any) -> str:
    """A path as text; an in-memory dataset or table by what it is."""
    import os

    if isinstance(v, (str, os.PathLike)):
        return os.fspath(v)
    src = getattr(v, "attrs", {}).get("source") if hasattr(v, "attrs") else None
    return str(src) if src else f"<{type(v).__name__} in memory>"


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    describe = getattr(v, "describe", None)
    if callable(describe):
        try:
            return describe()
        except TypeError:
            pass
    if hasattr(v, "__dataclass_fields__"):
        try:
            return _plain(asdict(v))
        except TypeError:
            pass
    return str(v)


DEFAULTS = Options()
"""The defaults of every option, stated once."""

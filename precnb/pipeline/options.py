"""The triage options: every option of every front end, with its one default.

The command line, the report, the explorer, the notebook templates and ``ds.prec`` all build
an :class:`Options` and hand it to :func:`precnb.diagnose`; none of them has a default of its
own. :data:`DEFAULTS` is the single statement of the defaults.

Examples
--------
>>> from precnb.pipeline.options import Options
>>> Options().step_offset is None    # 0 when both runs hold the same steps, else "auto"
True
>>> Options(target_layout="tp=2").describe()["target_layout"]
'tp=2'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

__all__ = ["DEFAULTS", "Options"]


@dataclass(frozen=True)
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
    spike_z, spike_ratio : float
        Spike test of the anomaly search (robust z-score, minimum jump ratio).
    spike_stats : tuple of str
        Statistics tested for spikes.
    limit : int
        How many further suspects a finding lists.
    replica_rtol : float
        Relative tolerance of the replica check.
    rank_table : path or mapping, optional
        Which host and device served each rank (an HCCL ``rank_table_file`` JSON, a
        ``rank,host,device`` CSV, or ``{rank: (host, device)}``): every finding naming a rank names
        them too (:mod:`precnb.pipeline.devices`).
    replica_baseline : path or xarray.Dataset, optional
        A clean run of the same training: decides which side of a two-replica departure is wrong.
    rng_regions : tuple of str
        Module path prefixes inside a model-parallel RNG region (Megatron's tracker): a random op there
        differs across TP ranks by design; elsewhere its departure is an unsynchronised seed.
    tensor_metrics : bool or None
        Judge the divergence on whole-tensor metrics (msprobe compare's) where both runs saved
        the tensors (``task: tensor``). None: whenever both runs hold tensor files and no layout
        is given; False: statistics only.
    monitor : path or xarray.Dataset, optional
        msprobe monitor output of the same job, read beside the run (the loss-spike diagnosis
        reads its gradients, updates and activations at every step).
    loss : path or pandas.DataFrame, optional
        A loss log: CSV ``step,loss[,rank]`` or TensorBoard event files (``precnb.io.read_loss_log``),
        or a DataFrame with those columns; the loss-spike diagnosis judges the loss on it.
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
    spike_z: float = 10.0
    spike_ratio: float = 5.0
    spike_stats: tuple[str, ...] = ("norm",)
    limit: int = 50
    replica_rtol: float = 1e-6
    tensor_metrics: bool | None = None  # issue #17 (precnb.pipeline.tensors)
    rank_table: Any = None  # issue #28 (precnb.pipeline.devices)
    replica_baseline: Any = field(default=None, compare=False)  # issue #28
    rng_regions: tuple[str, ...] = ()
    monitor: Any = field(default=None, compare=False)  # issue #29 (precnb.pipeline.tensors)
    loss: Any = field(default=None, compare=False)  # issue #29

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
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; known: {sorted(names)}")
        return cls(**kw)

    def with_(self, **kw: Any) -> Options:
        """A copy with some options changed."""
        return replace(self, **kw)

    def describe(self) -> dict[str, Any]:
        """JSON-ready view of the options that differ from :data:`DEFAULTS` (plus the essentials)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "client":
                continue
            v = getattr(self, f.name)
            if f.name in ("monitor", "loss", "replica_baseline"):  # data or a path: never compared by value
                if v is not None:
                    out[f.name] = _source(v)
                continue
            if v == getattr(DEFAULTS, f.name) and f.name not in ("step_offset", "crc"):
                continue
            out[f.name] = _plain(v)
        return out


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

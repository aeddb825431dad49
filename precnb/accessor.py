"""The ``ds.prec`` accessor: delegation to :func:`precnb.diagnose` and :mod:`precnb.analysis`, no cached results.

``ds.prec.<kind>()`` comes from the diagnosis registry (:meth:`PrecAccessor.finding`).

Examples
--------
>>> import precnb
>>> from precnb.schema import empty_dataset
>>> empty_dataset().prec.stacks()
{}
"""

from __future__ import annotations

import functools
import re
from typing import Any

import xarray as xr

__all__ = ["PrecAccessor"]


def side_table(ds: xr.Dataset, name: str) -> Any:
    """:func:`precnb.schema.side_table`, imported when first used.

    The accessor is registered while xarray is being imported, possibly from inside precnb.schema itself.
    """
    from precnb.schema import side_table as read

    return read(ds, name)


@xr.register_dataset_accessor("prec")
class PrecAccessor:
    """precnb helpers on canonical datasets (``ds.prec.*``)."""

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    # -- side tables -------------------------------------------------------------------
    def stacks(self) -> dict[str, list[str]]:
        """All call stacks, node → frames (innermost first as msprobe writes them)."""
        return side_table(self._ds, "stacks")

    def stack(self, node_or_tensor: str) -> list[str]:
        """Call-stack frames of a node (a tensor label is mapped to its node)."""
        node = self.node_of(node_or_tensor)
        return list(self.stacks().get(node, []))

    def construct(self) -> dict[str, str]:
        """The module tree from construct.json, node → parent node."""
        return side_table(self._ds, "construct")

    def ancestors(self, node_or_tensor: str) -> list[str]:
        """Parent chain of a node, innermost first."""
        tree = self.construct()
        node = self.node_of(node_or_tensor)
        out: list[str] = []
        seen = {node}
        while (parent := tree.get(node)) and parent not in seen:
            out.append(parent)
            seen.add(parent)
            node = parent
        return out

    def node_of(self, node_or_tensor: str) -> str:
        """The node of a tensor label (identity for node names)."""
        ds = self._ds
        if node_or_tensor in ds.indexes["tensor"]:
            return str(ds["node"].sel(tensor=node_or_tensor).values)
        return node_or_tensor

    # -- selection ---------------------------------------------------------------------
    def select(
        self,
        pattern: str | None = None,
        *,
        kind: str | None = None,
        role: str | None = None,
        direction: str | None = None,
        module: str | None = None,
    ) -> xr.Dataset:
        """Tensors whose label matches the regex *pattern* and the given coordinates.

        Examples
        --------
        >>> from precnb.schema import empty_dataset
        >>> empty_dataset().prec.select("linear", kind="api").sizes["tensor"]
        0
        """
        ds = self._ds
        keep = [True] * ds.sizes["tensor"]
        if pattern:
            rx = re.compile(pattern)
            keep = [k and bool(rx.search(str(t))) for k, t in zip(keep, ds["tensor"].values, strict=True)]
        for name, want in (("kind", kind), ("role", role), ("direction", direction)):
            if want is not None:
                vals = ds[name].values
                keep = [k and str(v) == want for k, v in zip(keep, vals, strict=True)]
        if module is not None:
            rx = re.compile(module)
            vals = ds["module"].values
            keep = [k and bool(rx.search(str(v))) for k, v in zip(keep, vals, strict=True)]
        return ds.isel(tensor=[i for i, k in enumerate(keep) if k])

    def nonfinite(self, **kw: Any) -> xr.DataArray:
        """See :func:`precnb.analysis.nonfinite`."""
        from precnb.analysis import nonfinite

        return nonfinite(self._ds, **kw)

    def summary(self) -> dict[str, Any]:
        """See :func:`precnb.analysis.summarize`."""
        from precnb.analysis import summarize

        return summarize(self._ds)

    def load_report(self) -> Any:
        """See :func:`precnb.load_report`."""
        from precnb.io.api import load_report

        return load_report(self._ds)

    # -- diagnosis (through the one pipeline, :func:`precnb.diagnose`) ---------------------------
    def diagnose(self, *, baseline: Any = None, **options: Any) -> Any:
        """Diagnose this run (against ``baseline=``, keyword-only); see :func:`precnb.diagnose`."""
        from precnb.pipeline import diagnose

        return diagnose(self._ds, baseline=baseline, **options)

    def finding(self, kind: str, target: Any = None, **options: Any) -> Any:
        """The pipeline's finding of the diagnosis *kind* on this run; see :func:`precnb.diagnose`.

        Every registered diagnosis is also a method of its kind's name (``ds.prec.nan_origin()``,
        ``ds.prec.loss_spike(loss=...)``, a plug-in's). For a diagnosis of a pair this run is the baseline and
        *target* the run compared (``base.prec.first_divergence(target)``); ``run=`` picks one run of a combined
        dataset.
        """
        from precnb.analysis import registry
        from precnb.pipeline import diagnose

        if registry.get(kind).mode == "pair":
            if target is None:
                raise TypeError(f"{kind}() compares a target run with this one (the baseline): give the target")
            return diagnose(target, baseline=self._ds, kinds=[kind], **_options(options)).finding
        return diagnose(self._one(options), kinds=[kind], **_options(options)).finding

    def __getattr__(self, name: str) -> Any:
        """``ds.prec.<kind>(...)`` for every registered diagnosis: :meth:`finding` of that kind."""
        if name.startswith("_"):
            raise AttributeError(name)
        from precnb.analysis import registry

        if registry.lookup(name) is None:
            raise AttributeError(f"'PrecAccessor' object has no attribute {name!r} (nor a diagnosis of that kind)")
        return functools.partial(self.finding, name)

    def anomalies(self, **options: Any) -> Any:
        """The pipeline's anomaly finding for this run; see :func:`precnb.diagnose`."""
        from precnb.analysis.diagnoses import ANOMALY

        return self.finding(ANOMALY, **options)

    def explore(self, *, baseline: Any = None, **options: Any) -> Any:
        """Open the notebook explorer on this run (``baseline=`` keyword-only); see :func:`precnb.explore`."""
        from precnb.widgets import explore

        return explore(self._ds, baseline=baseline, **options)

    def _one(self, options: dict[str, Any]) -> xr.Dataset:
        run = options.pop("run", None)
        if run is None or "run" not in self._ds.dims:
            return self._ds
        from precnb.combine import select_run

        return select_run(self._ds, run)


def _options(kw: dict[str, Any]) -> dict[str, Any]:
    """Pipeline options from the analysis functions' older keyword names (``rule=``)."""
    rule = kw.pop("rule", None)
    if rule is not None:
        kw.setdefault("spike_z", rule.z)
        kw.setdefault("spike_ratio", rule.ratio)
        kw.setdefault("spike_stats", tuple(rule.stats))
    return kw

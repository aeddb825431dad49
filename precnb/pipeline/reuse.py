"""What a rerun of :func:`precnb.diagnose` on the same runs reuses (the explorer's Rerun, Match, Unmatch).

The explorer reruns the triage on the datasets the first run read (:class:`precnb.pipeline.ReadRun`);
what depends on them and on options the rerun did not change is taken from the previous run
(:class:`precnb.analysis._memo.DatasetMemo`, by dataset identity):

* the shards merged and the fused projections combined (:func:`merged_pair`: the runs and their
  layouts);
* the alignment (:func:`alignment`: the runs and the same mapping document — another tolerance);
  after a Match / Unmatch the mapping changed and it is computed again, on each run's tree read
  once (:func:`precnb.analysis.align._tree`);
* the replica comparison of the target (:func:`precnb.analysis.replicas.replica_mismatches`);
* the pair's renaming, common grid and per-record relative differences
  (:mod:`precnb.analysis.compare.prep`, for :func:`precnb.analysis.compare.compare_runs`):
  another tolerance only thresholds them again.

Every diagnosis then runs as in a full triage, and the findings are ordered by
:func:`precnb.analysis.registry.order_findings`: the answer is the full rerun's
(``tests/test_rerun_reuse.py`` compares them on the bundled pairs).
"""

from __future__ import annotations

import json
from typing import Any

import xarray as xr

from precnb.analysis._memo import DatasetMemo

__all__ = ["alignment", "mapping_key", "merged_pair"]

_MERGED = DatasetMemo(size=2)
_ALIGNED = DatasetMemo(size=2)


def mapping_key(mapping: Any) -> str | None:
    """A text that identifies a mapping given in memory (``""``: none; None: not reusable, e.g. a file path)."""
    if mapping is None:
        return ""
    if isinstance(mapping, dict):
        try:
            return json.dumps(mapping, sort_keys=True, allow_nan=True, default=repr)
        except (TypeError, ValueError):
            return None
    return None


def merged_pair(raw_b: xr.Dataset, raw_t: xr.Dataset, b_lay: Any, t_lay: Any, notes: list[str]
                ) -> tuple[xr.Dataset, xr.Dataset]:
    """(baseline, target) compared: shards merged by layout, fused projections combined; what was done in *notes*."""
    from precnb.analysis.align.fused import fuse_pair
    from precnb.pipeline.layout_merge import merge_layouts

    def compute() -> tuple[xr.Dataset, xr.Dataset, list[str]]:
        said: list[str] = []
        merged_b, targ = merge_layouts(raw_b, raw_t, b_lay, t_lay, said)
        base, targ = fuse_pair(merged_b if merged_b is not None else raw_b, targ)
        return base, targ, said

    base, targ, said = _MERGED.get([raw_b, raw_t], ("merged", repr(b_lay), repr(t_lay)), compute, copy=False)
    notes.extend(said)
    return base, targ


def alignment(base: xr.Dataset, targ: xr.Dataset, mapping: Any) -> Any:
    """:func:`precnb.analysis.align.align` of the pair, reused for the same runs and mapping document.

    An :class:`~precnb.analysis.align.Alignment` is never changed once made: the same one is shared.
    """
    from precnb.analysis.align import align

    key = mapping_key(mapping)
    if key is None:  # a file (it may have changed on disk) or an object: computed again
        return align(base, targ, mapping=mapping)
    return _ALIGNED.get([base, targ], ("align", key), lambda: align(base, targ, mapping=mapping), copy=False)

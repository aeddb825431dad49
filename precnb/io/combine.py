"""Compatibility alias: moved to :mod:`precnb.combine`."""

from precnb.combine import FILL_VALUES, combine_runs, reindex_tensors

__all__ = ["FILL_VALUES", "combine_runs", "reindex_tensors"]

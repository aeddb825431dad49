"""Tensor-parallel glue: :mod:`precnb.analysis.layout.rank_args`, whose public names stay importable from here.

The module moved below the replica family: the merge, the comparison and the aligner use it too.
"""

from __future__ import annotations

from precnb.analysis.layout.rank_args import (
    RANK_DEPENDENT,
    REDUCE_CODES,
    glue_aside,
    glue_labels,
    is_optimizer_api,
    mark_rank_args,
    rank_dependent,
    reduce_ops,
    scalar_sigs,
)

__all__ = ["RANK_DEPENDENT", "REDUCE_CODES", "glue_aside", "glue_labels", "is_optimizer_api", "mark_rank_args",
           "rank_dependent", "reduce_ops", "scalar_sigs"]

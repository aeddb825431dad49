"""First divergence between a baseline and a target run: the search and what it needs.

* :mod:`~precnb.analysis.divergence.search` — :func:`first_divergence` (in memory, or step by step
  for lazily opened runs, with :mod:`~precnb.analysis.divergence.stepwise`, which loads only the steps the
  answer needs) and :func:`pair_comparison`, the comparison it judges;
* :mod:`~precnb.analysis.divergence.judged` — the pair as the search judges it (differences, stats,
  hints, what was set aside); :mod:`~precnb.analysis.divergence.origin` — the finding at the origin
  (with :mod:`~precnb.analysis.divergence.culprit`, the culprit module), and
  :mod:`~precnb.analysis.divergence.structural` — nodes recorded in one run only;
* :mod:`~precnb.analysis.divergence.crossfw` — two frameworks: their noise floor and the differences
  they only record differently;
* :mod:`~precnb.analysis.divergence.versions` — differences that are how two msprobe releases record;
* :mod:`~precnb.analysis.divergence.hints` — hints that turn the numbers into likely causes, and
  :mod:`~precnb.analysis.divergence.scalars` — the scalar arguments (an ``eps``, a scale) that differ
  between the two runs' records of the divergent node, a certain cause.
"""

from __future__ import annotations

from precnb.analysis.divergence.crossfw import noise_floor, searched_differences, two_frameworks
from precnb.analysis.divergence.search import first_divergence, first_divergence_stepwise, pair_comparison
from precnb.analysis.divergence.structural import structural_differences

__all__ = ["first_divergence", "first_divergence_stepwise", "noise_floor", "pair_comparison", "searched_differences",
           "structural_differences", "two_frameworks"]

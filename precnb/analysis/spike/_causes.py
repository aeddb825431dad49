"""The four causes of a loss spike, each a test on what the dump and the monitor hold.

Every test returns candidates (dicts): ``cause``, ``certain``, ``text``, the origin (``step``,
``rank`` — None when every rank shows it —, ``node``, ``tensor``, ``module``), ``strength``
(log10 of the departure, to rank uncertain candidates), ``series`` (what decided it, in words)
and ``records`` (``(view, step, rank, tensor)`` the explorer colours).

* **data** (at the spike step ``S``): the ranks whose own loss departs while others do not, and
  the batch inputs (integer forward inputs such as token ids and labels; a monitor's first module
  input) that stand out against every other (step, rank) of the same tensor;
* **optimizer** (at ``S - 1``, ``S - 2``): an optimizer argument (``lr``, SGD's ``alpha``,
  ``addcdiv_``'s ``value``) that jumps ``>= 3x`` against its other steps, or a parameter's update
  (the weight change of the step: the largest change of Max / Min / Norm between monitor
  ``param_origin`` and ``param_updated``, or a dumped in-place update's input and output) that
  jumps ``>= 10x`` its history while the gradient stays within 2x of its own;
* **hardware** (gradient, at ``S - 1``, ``S - 2``; at ``S`` on the gradient-norm proxy): one rank's
  gradient of a parameter before the reduce ``>= 10x`` the other DP ranks' and its own history,
  while its module's inputs (forward input, gradient of its output) are within 2x of the other
  ranks'; after the reduce every rank carries it;
* **numerics** (at ``S - 1``, and ``S`` before the loss op): a new overflow (an element at ±inf:
  Max or Min, not a Norm alone — msprobe takes a float16 tensor's Norm in float16; never one there
  by design, such as a causal mask's ``masked_fill(-inf)``: see :mod:`precnb.analysis.spike._numerics`), a
  float16/bfloat16 value within 2x of the dtype's largest, a tensor that underflows to zero, or a
  loss-scale change (every gradient of a rank scaled by one factor ``>= 10x`` while its forward
  is ordinary).
"""

from __future__ import annotations

from precnb.analysis.spike._common import DEPART
from precnb.analysis.spike._data import data_causes
from precnb.analysis.spike._hardware import hardware_causes
from precnb.analysis.spike._numerics import numerics_causes
from precnb.analysis.spike._optimizer import optimizer_causes

__all__ = ["DEPART", "data_causes", "hardware_causes", "numerics_causes", "optimizer_causes"]

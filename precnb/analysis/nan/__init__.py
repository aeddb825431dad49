"""Where NaN (or a new ±inf) first appeared, across ranks, and why.

* :mod:`~precnb.analysis.nan.origin` — :func:`nan_origin`: the first NaN or new infinity in causal
  order (benign masks and by-design non-finite tensors left out), as a finding;
* :mod:`~precnb.analysis.nan.causes` — the likely causes at the origin, read from the statistics of
  the op's operands (a division by a tensor holding zero, an overflow of the dtype, ...).

The masks (:mod:`precnb.analysis.masks`), the undefined entries (:mod:`precnb.analysis.undefined`), which
non-finite records are events (:mod:`precnb.analysis.events`; :func:`event_mask` and its helpers are re-exported
here), the causal order and the coverage gaps (:mod:`precnb.analysis.causal`) are shared with the other diagnoses
and live outside this package.
"""

from __future__ import annotations

from precnb.analysis.nan.origin import MASKING_APIS, event_mask, lazy_persistence, nan_origin, persistent_nonfinite

__all__ = ["MASKING_APIS", "event_mask", "lazy_persistence", "nan_origin", "persistent_nonfinite"]

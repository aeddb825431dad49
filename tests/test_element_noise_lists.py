"""One element's Adam noise in a fused optimizer's gradient list entry (level L1: no gradient records).

The numbers are those of the healthy tp2 sequence-parallel L1 run of seed 2500 against its tp1 L1 run (the
accuracy benchmark's rescore at 197b513d, the pair's only finding): at step 1, after one AdamW step, the gradient
entry of a [32, 64] weight differs in its Min alone, by 1.2 tolerances, while its parameter's entry moved within
the tolerance.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from precnb.analysis.divergence.element_noise import list_entry_noise

NODE = "Torch._fused_adamw_.0.forward"
GRAD, PARAM = f"{NODE}.input.1.39", f"{NODE}.input.0.39"
RTOL = 6.1e-5


def _tab(grad_t: list[float], param_rel: float, *, lr: tuple[int, float] | None = (0, 1e-3), step: int = 1):
    grad_b = [0.0037447, -0.00413096, -3.92466e-05, 0.0451983]
    stats = np.array([[[grad_t, grad_b]]])  # (step, rank, tensor, stat): the grad entry, then a filler
    bstats = np.array([[[grad_b, grad_b]]])
    rel = np.abs(stats - bstats).max(axis=-1) / np.abs(bstats).max(axis=-1)
    rel[0, 0, 1] = param_rel
    return SimpleNamespace(adam_lr=lr, step_values=[step], labels=[GRAD, PARAM], nodes=[NODE, NODE],
                           numel=np.full((1, 1, 2), 2048.0), rtol=np.full(2, RTOL), rel=rel, stats=stats,
                           bstats=bstats, both=np.ones((1, 1, 2), bool), where={GRAD: 0, PARAM: 1})


REAL = [0.0037447, -0.00413127, -3.92465e-05, 0.0451984]


def test_a_gradient_entry_whose_min_alone_moved_after_an_adam_step_is_noise():
    assert list_entry_noise(_tab(REAL, 3e-5), 0, 0, 0)


def test_a_scaled_gradient_or_one_before_any_update_or_with_a_parameter_that_agrees_or_departs_is_not():
    scaled = [x * 1.001 for x in REAL]  # a dw fault of 1e-3 moves the Norm and the Mean too
    assert not list_entry_noise(_tab(scaled, 3e-5), 0, 0, 0)
    assert not list_entry_noise(_tab(REAL, 3e-5, lr=None), 0, 0, 0)  # no Adam update recorded
    assert not list_entry_noise(_tab(REAL, 3e-5, lr=(1, 1e-3)), 0, 0, 0)  # the step of the first update
    assert not list_entry_noise(_tab(REAL, 0.0), 0, 0, 0)  # parameters bit for bit equal (a twin)
    assert not list_entry_noise(_tab(REAL, 2 * RTOL), 0, 0, 0)  # the parameter itself departs

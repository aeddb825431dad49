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


# draw 7's healthy tp2 twin (seed 3471) against tp1 at step 3: the second moment (exp_avg_sq, list 3) of layer 3's
# input layernorm weight differs in its Max alone (1.1 tolerances), its parameter bit for bit equal in both runs
V_B = [2.51161e-09, 5.04244e-11, 5.8058e-10, 4.62887e-09]
V_T = [2.51178e-09, 5.04229e-11, 5.80573e-10, 4.62882e-09]


def _moment_tab(vt: list[float], param_rel: float, list_no: int = 3):
    label, param = f"{NODE}.input.{list_no}.31", f"{NODE}.input.0.31"
    stats, bstats = np.array([[[vt, V_B]]]), np.array([[[V_B, V_B]]])
    rel = np.abs(stats - bstats).max(axis=-1) / np.abs(bstats).max(axis=-1)
    rel[0, 0, 1] = param_rel
    return SimpleNamespace(adam_lr=(0, 1e-3), step_values=[3], labels=[label, param], nodes=[NODE, NODE],
                           numel=np.full((1, 1, 2), 32.0), rtol=np.full(2, RTOL), rel=rel, stats=stats,
                           bstats=bstats, both=np.ones((1, 1, 2), bool), where={label: 0, param: 1})


def test_a_moment_entry_whose_max_alone_moved_is_noise_though_its_parameter_agrees_bit_for_bit():
    assert list_entry_noise(_moment_tab(V_T, 0.0), 0, 0, 0)
    assert list_entry_noise(_moment_tab(V_T, 0.0, list_no=2), 0, 0, 0)  # the first moment alike


def test_a_scaled_moment_or_one_whose_parameter_departs_is_not():
    assert not list_entry_noise(_moment_tab([x * 1.027 for x in V_T], 0.0), 0, 0, 0)  # the optimizer-state fault
    assert not list_entry_noise(_moment_tab(V_T, 2 * RTOL), 0, 0, 0)
    assert not list_entry_noise(_moment_tab(V_T, 0.0, list_no=4), 0, 0, 0)  # not a moment: max_exp_avg_sqs, steps


def test_an_op_in_a_weightless_module_is_judged_by_its_enclosing_modules_weights():
    """Draw 7's same pair at step 2: a rotary multiply's backward under core attention (no weights) differs in its
    Max alone, 3.5 tolerances, while self attention's weights moved within the tolerance."""
    from precnb.analysis.divergence.element_noise import one_element_noise

    b = [1.507948e-05, -1.396493e-05, -1.871974e-08, 3.335127e-05]
    t = [1.507628e-05, -1.396501e-05, -1.871786e-08, 3.33493e-05]
    core = "Module.0.decoder.layers.3.self_attention.core_attention.DotProductAttention.backward.0"
    stats, bstats = np.array([[[t, b, b]]]), np.array([[[b, b, b]]])
    rel = np.abs(stats - bstats).max(axis=-1) / np.abs(bstats).max(axis=-1)

    def tab(weights_rel: float, under: str):
        r = rel.copy()
        r[0, 0, 1:] = weights_rel
        return SimpleNamespace(
            adam_lr=(0, 1e-3), step_values=[2], parents=[core, "", ""], roles=["output", "parameter", "parameter"],
            nodes=["Tensor.__mul__.70.backward", "w", "w"], numel=np.full((1, 1, 3), 512.0), rtol=np.full(3, RTOL),
            rel=r, stats=stats, bstats=bstats, both=np.ones((1, 1, 3), bool),
            params_under=lambda m: [1, 2] if m == under else [])

    assert one_element_noise(tab(3e-5, "Module.0.decoder.layers.3.self_attention"), 0, 0, 0)
    assert not one_element_noise(tab(0.0, "Module.0.decoder.layers.3.self_attention"), 0, 0, 0)  # a twin
    assert not one_element_noise(tab(2 * RTOL, "Module.0.decoder.layers.3.self_attention"), 0, 0, 0)
    assert not one_element_noise(tab(3e-5, "Module.0.decoder.layers.4"), 0, 0, 0)  # no weights around it

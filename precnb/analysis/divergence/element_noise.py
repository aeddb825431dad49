"""One element's noise after an Adam step: a difference only an extreme shows, in a module whose weights moved.

Applies to an op's output and to a parameter's gradient (a layernorm weight's gradient sums ``g * x_hat`` over the
tokens: one unit's shift shows in one element of it).

Adam moves each element by about ``lr * m / (sqrt(v) + eps)``: where a gradient element is about zero (a neuron
that dropout or the data left almost idle at the first step), that ratio turns its rounding noise into a move of
up to ``lr`` that differs between two healthy layouts, in that one element
(:meth:`precnb.analysis.divergence.carried._Entry._optimizer_step` carries the parameter itself). At the next
step the element perturbs what its module computes through it — one bias element shifts one neuron's
pre-activation for every token — and a sum over the tokens (that bias's gradient) can differ beyond the
tolerance in that one element, while the tensor's Mean and Norm agree: no statistic of the inputs shows it.

So an output difference is that noise, not an origin, when all of these hold:

* an Adam-family update was recorded before this step (its ``lr`` read from the dump);
* only an extreme differs: the Max or the Min beyond the tolerance, the Mean and the Norm within it
  (a fault that scales, zeroes or perturbs a tensor moves its Norm or Mean too);
* by at most :data:`ELEMENT_FACTOR` times the tolerance (a fault of 1e-3 relative and more stays an origin);
* the module call it runs in (or, when it holds none, its nearest enclosing module) holds parameters that differ
  between the runs, each within the tolerance (the optimizer's noise regime: in a comparison with a healthy twin
  the parameters agree bit for bit before a fault, and the rule never applies).

The same holds for a fused optimizer's gradient list entry no recorded op produced (level L1 records no
parameter gradient) and for its moments' entries: its parameter's entry (list 0, same index) stands for the
module's weights (:func:`list_entry_noise`).

Examples
--------
>>> ELEMENT_FACTOR
8.0
"""

from __future__ import annotations

from typing import Any

import numpy as np

from precnb.analysis.divergence.list_entries import is_list_entry

__all__ = ["ELEMENT_FACTOR", "list_entry_noise", "one_element_noise"]

ELEMENT_FACTOR = 8.0
_MAX, _MIN, _MEAN, _NORM = 0, 1, 2, 3


def _within(a: np.ndarray, b: np.ndarray, k: int, rtol: float, scale: float) -> bool:
    return abs(float(a[k]) - float(b[k])) <= rtol * max(abs(float(a[k])), abs(float(b[k])), scale)


def extremes_only(a: np.ndarray, b: np.ndarray, numel: float, rtol: float) -> bool:
    """Whether statistics *a* and *b* (Max, Min, Mean, Norm) differ beyond *rtol* in an extreme only.

    The Mean is judged against the tensor's magnitude as the comparison judges it (max |x|, Norm / sqrt(n)).

    >>> a = np.array([6.5446e-4, -7.0513e-4, -1.74811e-5, 2.786912e-3])
    >>> b = np.array([6.5434e-4, -7.0513e-4, -1.74819e-5, 2.786884e-3])
    >>> extremes_only(a, b, 128, 6.1e-5), extremes_only(a * 1.01, b, 128, 6.1e-5)
    (True, False)
    """
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return False
    rms = max(abs(float(a[_NORM])), abs(float(b[_NORM]))) / np.sqrt(max(numel, 1.0))
    amax = max(abs(float(x)) for x in (a[_MAX], a[_MIN], b[_MAX], b[_MIN]))
    scale = max(rms, amax)
    if not (_within(a, b, _MEAN, rtol, scale) and _within(a, b, _NORM, rtol, 0.0)):
        return False
    return not (_within(a, b, _MAX, rtol, 0.0) and _within(a, b, _MIN, rtol, 0.0))


def _module_of(parent: str) -> str:
    """The module path of a module call or of its parameters' gradients.

    >>> _module_of("Module.0.decoder.layers.1.mlp.MLP.backward.0")
    'Module.0.decoder.layers.1.mlp'
    >>> _module_of("Module.0.decoder.layers.1.pre_mlp_layernorm.RMSNorm.parameters_grad.0")
    'Module.0.decoder.layers.1.pre_mlp_layernorm'
    """
    for d in (".forward.", ".backward.", ".parameters_grad."):
        head, sep, _ = parent.rpartition(d)
        if sep and parent.startswith(("Module.", "Cell.")):
            return head.rpartition(".")[0]
    return ""


def _nearest_params(tab: Any, module: str, si: int, ri: int) -> list[int]:
    """The parameters of *module*, or of its nearest enclosing module that holds any (recorded in both runs).

    A module without weights (core attention, a rotary embedding's multiply) computes on what its enclosing
    module's weights made: their moving within the tolerance is the optimizer's noise regime there too.

    >>> class T:
    ...     both = np.ones((1, 1, 2), bool)
    ...     def params_under(self, m):
    ...         return [0, 1] if m == "Module.0.layers.3.self_attention" else []
    >>> _nearest_params(T(), "Module.0.layers.3.self_attention.core_attention", 0, 0)
    [0, 1]
    >>> _nearest_params(T(), "Module.0.layers.4", 0, 0)
    []
    """
    while module.count(".") >= 2:  # up to the model's own module (``Module.0.x``), not beyond
        params = [p for p in tab.params_under(module) if tab.both[si, ri, p]]
        if params:
            return params
        module = module.rpartition(".")[0]
    return []


def one_element_noise(tab: Any, si: int, ri: int, c: int, factor: float = ELEMENT_FACTOR) -> bool:
    """Whether output or gradient *c*'s difference at (*si*, *ri*) is one element's Adam noise (see the module).

    *tab* is the carried rules' table of a judged pair (:class:`precnb.analysis.divergence.carried._Tables`).
    """
    lr = tab.adam_lr
    if lr is None or tab.step_values[si] <= lr[0] or tab.parents is None or tab.numel is None:
        return False
    rtol = float(tab.rtol[c])
    if not float(tab.rel[si, ri, c]) <= factor * rtol:
        return False
    a, b = tab.stats[si, ri, c], tab.bstats[si, ri, c]
    if not extremes_only(a, b, float(tab.numel[si, ri, c]), rtol):
        return False
    where = str(tab.nodes[c]) if tab.roles[c] == "grad" else str(tab.parents[c])  # a gradient: its own module
    params = _nearest_params(tab, _module_of(where), si, ri)
    moved = [p for p in params if 0.0 < float(tab.rel[si, ri, p]) <= float(tab.rtol[p])]
    return bool(moved) and len(moved) + sum(float(tab.rel[si, ri, p]) == 0.0 for p in params) == len(params)


def list_entry_noise(tab: Any, si: int, ri: int, c: int, factor: float = ELEMENT_FACTOR) -> bool:
    """Whether a fused optimizer's gradient or moment list entry *c* differs at (*si*, *ri*) by one element's noise.

    The moments (lists 2 and 3: ``exp_avg``, ``exp_avg_sq``) are running means of the gradient: one gradient
    element's noise at an earlier step stays in one element of them.

    As :func:`one_element_noise`, with the parameter's own list entry (``...input.0.K`` for ``...input.1.K``) as
    the weights that must have moved within the tolerance.
    """
    lr = tab.adam_lr
    label, node = str(tab.labels[c]), str(tab.nodes[c])
    if lr is None or tab.step_values[si] <= lr[0] or tab.numel is None or not is_list_entry(label, node,
                                                                                             lists=(1, 2, 3)):
        return False
    rtol = float(tab.rtol[c])
    if not float(tab.rel[si, ri, c]) <= factor * rtol:
        return False
    if not extremes_only(tab.stats[si, ri, c], tab.bstats[si, ri, c], float(tab.numel[si, ri, c]), rtol):
        return False
    head, _, entry = label.rpartition(".")
    p = tab.where.get(f"{head.rpartition('.')[0]}.0.{entry}")
    if p is None or not bool(tab.both[si, ri, p]):
        return False
    # a moment keeps an earlier step's gradient noise while its parameter may agree bit for bit (Adam's move of
    # a layernorm weight, about lr * sign, rounds alike): within the tolerance is enough there; a gradient entry
    # needs its parameter to have moved (the optimizer's noise regime, never a twin's before a fault)
    moment = head.rpartition(".")[2] in ("2", "3")
    moved = float(tab.rel[si, ri, p])
    return (moment or moved > 0.0) and moved <= float(tab.rtol[p])

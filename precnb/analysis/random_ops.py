"""Random ops: torch calls whose output is drawn from a generator (a leaf: the replica check and the search use it).

The replica check (:mod:`precnb.analysis.replicas`) calls a replica departure at a random op with identical inputs
an unsynchronised seed; the first-divergence search (:mod:`precnb.analysis.divergence.random_draws`) sets aside a
random op whose draw another layout changes by design.

Examples
--------
>>> is_random_op("Torch.normal"), is_random_op("Functional.dropout"), is_random_op("Torch.rsqrt")
(True, True, False)
>>> is_random_op("Functional.dropout.8.forward")
True
"""

from __future__ import annotations

__all__ = ["RANDOM_OPS", "is_random_op"]

#: torch ops whose output is drawn from a generator (API names without the ``Torch.``/``Tensor.``/``Functional.``
#: prefix; in-place variants end with ``_``)
RANDOM_OPS = frozenset({
    "normal", "normal_", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "bernoulli", "bernoulli_", "multinomial", "poisson", "uniform_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "random_", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "feature_alpha_dropout", "fused_dropout", "native_dropout", "rrelu", "gumbel_softmax",
})


def is_random_op(api: str) -> bool:
    """True for an msprobe API name (``Torch.normal``, ``Functional.dropout``) or API node of a random op.

    A node name (``Functional.dropout.8.forward``) is read as its API (its first two parts).
    """
    parts = str(api).split(".")
    if len(parts) > 2 and parts[0] in ("Torch", "Tensor", "Functional", "NPU", "Aten", "Mint", "Jit"):
        parts = parts[:2]
    name = parts[-1]
    return name in RANDOM_OPS or name.lstrip("_") in RANDOM_OPS

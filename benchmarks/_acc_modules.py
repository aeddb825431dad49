"""The accuracy benchmark's module rule: a finding's rank-local module against the truth's whole-model one.

**Module rule.** precnb reports a rank-local module (``0.decoder.layers.0.self_attention.core_attention``:
the virtual-pipeline chunk, then the path inside the chunk). It is mapped to the whole-model module with the
layer numbers the worker reported for that run and rank (``result.json``), never with precnb's own mapping
text. The finding's module is right when it lies in the same *layer submodule* as the truth's (the first
four components ``decoder.layers.<n>.<child>``, or the first two outside the decoder layers, e.g.
``embedding.word_embeddings``) and one of the two paths is a prefix of the other: truth
``decoder.layers.2.mlp.linear_fc2`` accepts ``decoder.layers.2.mlp.linear_fc2`` and ``decoder.layers.2.mlp``
but not ``decoder.layers.2`` nor anything in another layer.

>>> global_module("0.decoder.layers.0.mlp.linear_fc2", {"0": [3]})
'decoder.layers.2.mlp.linear_fc2'
>>> module_right("decoder.layers.2.mlp", "decoder.layers.2.mlp.linear_fc2")
True
>>> module_right("decoder.layers.2", "decoder.layers.2.mlp.linear_fc2")
False
>>> module_right("decoder.layers.3.mlp.linear_fc2", "decoder.layers.2.mlp.linear_fc2")
False
"""

from __future__ import annotations

import re

__all__ = ["global_module", "module_right"]

LAYER = re.compile(r"^decoder\.layers\.(\d+)(\.|$)")


def global_module(module: str | None, layer_numbers: dict[str, list[int]]) -> str | None:
    """Whole-model path of precnb's rank-local ``<chunk>.<path>`` module (as given when it has no chunk)."""
    if not module:
        return None
    head, _, path = module.partition(".")
    if not head.isdigit():
        return module
    m = LAYER.match(path)
    if m and head in layer_numbers and int(m.group(1)) < len(layer_numbers[head]):
        return f"decoder.layers.{layer_numbers[head][int(m.group(1))] - 1}" + path[m.end(1):]
    return path


def _submodule(path: str) -> str:
    parts = path.split(".")
    return ".".join(parts[:4] if LAYER.match(path) else parts[:2])


def module_right(found: str | None, truth: str | None) -> bool:
    """The module rule of this module's docstring."""
    if not found or not truth or _submodule(found) != _submodule(truth):
        return False
    return found == truth or found.startswith(truth + ".") or truth.startswith(found + ".")

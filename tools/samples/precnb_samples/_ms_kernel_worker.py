"""MindSpore's own kernel (e2e) dump of a resumed tiny GPT, GRAPH_MODE on CPU; a standalone script.

Run by the sample generator with the MindSpore interpreter (``PRECNB_MINDSPORE_PYTHON``)::

    $PRECNB_MINDSPORE_PYTHON tools/samples/precnb_samples/_ms_kernel_worker.py spec.json

It imports neither precnb nor torch nor msprobe. ``spec.json`` has ``job``:

``pretrain``
    Train ``iterations`` steps from a seeded initialisation (no dump) and save a checkpoint
    (``ckpt``) with the optimizer state (``adam_m.*``, ``adam_v.*``, ``global_step``).
``resume``
    Build the model, load ``ckpt`` and train ``iterations`` more steps with the dump enabled
    (the caller sets ``MINDSPORE_DUMP_CONFIG`` in this process's environment). With
    ``stale_name_map`` the checkpoint keys are first renamed by that map (a conversion written
    for an older version of the model) and the RMSNorm weights start at zero, so the renamed
    weight is not loaded (``load_param_into_net(..., strict_load=True)`` lists it as not
    loaded) and stays 0. (Without ``strict_load`` MindSpore falls back to a parameter whose name
    ends the same way and loads ``adam_m.net.norm_out.weight`` into it instead.)

Both write ``result`` (JSON): losses, parameters not loaded, checkpoint values of the norms,
versions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _build(cfg: dict[str, Any], norm_init: str, lr: float, weight_decay: float) -> tuple[Any, Any]:
    from _ms_model import TinyGPT, cross_entropy_loss
    from mindspore import nn  # type: ignore[import-not-found]

    class NetWithLoss(nn.Cell):  # type: ignore[misc]
        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        def construct(self, x: Any, y: Any) -> Any:
            return cross_entropy_loss(self.net(x), y, cfg["vocab"])

    net = TinyGPT(cfg, norm_init=norm_init)
    with_loss = NetWithLoss(net)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=lr, weight_decay=weight_decay)
    return nn.TrainOneStepCell(with_loss, opt), net


def _batch(cfg: dict[str, Any], iteration: int) -> tuple[Any, Any]:
    import mindspore as ms  # type: ignore[import-not-found]
    import numpy as np

    rng = np.random.default_rng(1000 + iteration)
    tokens = rng.integers(0, cfg["vocab"], size=(cfg["batch"], cfg["seq"] + 1), dtype=np.int32)
    return ms.Tensor(tokens[:, :-1].copy()), ms.Tensor(tokens[:, 1:].copy())


def _is_norm(name: str) -> bool:
    return name.endswith(".weight") and "norm" in name.rsplit(".", 2)[-2]


def main(spec_path: str) -> int:
    """Run the job described by *spec_path*."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import mindspore as ms  # type: ignore[import-not-found]
    import numpy as np

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(spec.get("seed", 1234))
    cfg = spec["cfg"]
    stale = spec.get("stale_name_map") or {}
    train, net = _build(cfg, "zeros" if stale else "ones", spec["lr"], spec["weight_decay"])
    train.set_train()
    result: dict[str, Any] = {"job": spec["job"], "mindspore_version": ms.__version__}
    first = 0
    if spec["job"] == "resume":
        ckpt = ms.load_checkpoint(spec["ckpt"])
        if stale:
            ckpt = {stale.get(k, k): v for k, v in ckpt.items()}
        not_loaded, ckpt_not_used = ms.load_param_into_net(train, ckpt, strict_load=True)
        result["param_not_load"] = sorted(not_loaded)
        result["ckpt_not_load"] = sorted(ckpt_not_used)
        result["renamed_keys"] = {k: v for k, v in stale.items()}
        first = int(ckpt["global_step"].asnumpy().reshape(-1)[0]) if "global_step" in ckpt else 0
    result["start_global_step"] = first
    result["norm_weights_before"] = {
        p.name: {"min": float(p.asnumpy().min()), "max": float(p.asnumpy().max()),
                 "mean": float(p.asnumpy().mean())}
        for p in net.get_parameters() if _is_norm(p.name)
    }
    losses = []
    for i in range(spec["iterations"]):
        x, y = _batch(cfg, first + i)
        losses.append(float(train(x, y).asnumpy()))
    result["losses"] = losses
    if spec["job"] == "pretrain":
        ms.save_checkpoint(train, spec["ckpt"])
    result["norm_weights_after"] = {
        p.name: float(np.asarray(p.asnumpy()).mean()) for p in net.get_parameters()
        if _is_norm(p.name)
    }
    Path(spec["result"]).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

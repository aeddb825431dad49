"""Train the MindSpore port of the tiny GPT under msprobe (PyNative, CPU); a standalone script.

Run by the sample generator with the MindSpore interpreter (``PRECNB_MINDSPORE_PYTHON``, a venv
with ``numpy<2``, ``mindspore==2.10.0`` and ``mindstudio-probe==26.2.0``)::

    $PRECNB_MINDSPORE_PYTHON tools/samples/precnb_samples/_ms_port_worker.py spec.json

It imports neither precnb nor torch. ``spec.json``: ``config`` (msprobe config.json), ``cfg``
(model sizes), ``state`` (npz of the PyTorch initial state dict), ``batches`` (npz ``x<step>`` /
``y<step>``), ``steps``, ``lr``, ``weight_decay``, ``eps`` (``{"layers.1.ffn_norm": 1e-2}`` for
the injected bug, ``{}`` for the healthy port) and ``result`` (JSON written at the end: losses,
name map, versions).

CPU workarounds (MindSpore 2.10): msprobe's statistics call ``mint.norm``, whose
LinalgVectorNorm kernel is not registered on CPU, so it is replaced by ``sqrt(sum(x*x))`` before
msprobe is imported (the ops used are in msprobe's own list of internally used APIs, so they
are not dumped); MindSpore's AdamW fails on CPU under msprobe, so the optimizer step is written
out (torch.optim.AdamW's formula in float32 numpy) and runs after ``debugger.stop()``.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _patch_norm() -> None:
    from mindspore import mint, ops  # type: ignore[import-not-found]

    def norm(x, *args, **kwargs):  # type: ignore[no-untyped-def]
        if args or kwargs:
            raise NotImplementedError("only the default 2-norm of the whole tensor is patched")
        return ops.sqrt(ops.square(x).sum())

    mint.norm = norm


def main(spec_path: str) -> int:
    """Run one job described by *spec_path*."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import mindspore as ms  # type: ignore[import-not-found]
    import numpy as np

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    _patch_norm()
    from _ms_model import TinyGPT, adamw_numpy, cross_entropy_loss, load_torch_state
    from msprobe.mindspore import PrecisionDebugger  # type: ignore[import-not-found]

    cfg = spec["cfg"]
    net = TinyGPT(cfg, eps=spec.get("eps") or {})
    state = dict(np.load(spec["state"], allow_pickle=False))
    names = load_torch_state(net, state, cfg["blocks"])
    batches = np.load(spec["batches"], allow_pickle=False)
    params = net.trainable_params()

    def forward(x, y):  # type: ignore[no-untyped-def]
        return cross_entropy_loss(net(x), y, cfg["vocab"])

    grad_fn = ms.value_and_grad(forward, None, params)
    debugger = PrecisionDebugger(config_path=spec["config"])
    opt_state: dict[str, object] = {}
    losses = []
    for step in range(spec["steps"]):
        x = ms.Tensor(batches[f"x{step}"].astype(np.int32))
        y = ms.Tensor(batches[f"y{step}"].astype(np.int32))
        debugger.start(model=net)
        loss, grads = grad_fn(x, y)
        debugger.stop()
        adamw_numpy(params, list(grads), opt_state, step + 1, lr=spec["lr"],
                    weight_decay=spec["weight_decay"])
        debugger.step()
        losses.append(float(loss.asnumpy()))
    result = {
        "losses": losses,
        "param_name_map_pt_to_ms": names,
        "weights_equal_to_pytorch_init_asserted": True,
        "versions": {"mindspore": ms.__version__, "numpy": np.__version__,
                     "mindstudio-probe (msprobe)": metadata.version("mindstudio-probe")},
        "pid": os.getpid(),
    }
    Path(spec["result"]).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Train the matrix's tiny MindSpore model for 2 steps under one msprobe release (a standalone script).

Run by ``generate.py`` with the interpreter of the release's MindSpore venv
(``/work/venvs/msprobe-<version>-ms``: ``numpy<2``, ``mindspore==2.10.0``, the release)::

    /work/venvs/msprobe-<version>-ms/bin/python tools/msprobe_matrix/_ms_worker.py spec.json

It imports mindspore and msprobe, never precnb or torch. ``spec.json``: ``config`` (msprobe config.json),
``graph`` (``"pynative"``: PyNative mode; ``"jit"``: PyNative with the ``head`` cell under ``mindspore.jit``,
which msprobe dumps into ``graph/`` and ``pynative/`` trees; ``"graph"``: GRAPH_MODE, jit_level O0, the
whole network one graph), ``steps`` and ``result``.

The model mirrors ``_pt_worker.py``'s: ``fc1`` (Dense 6->8, no bias), ``+ 0.5``, ``act`` (ReLU), ``fc2``
(Dense 8->4), ``masked_fill(mask, -inf)`` (Infinity literals) and ``logits - logits`` (NaN literals,
not in the loss); cross-entropy; weights and batches from numpy with fixed seeds. CPU workarounds
(MindSpore 2.10, taken from ``tools/samples/precnb_samples``: ``_ms_port_worker._patch_norm``,
``_ms_model.adamw_numpy``): ``mint.norm`` (its
LinalgVectorNorm kernel is not registered on CPU, and msprobe's statistics call it) is replaced by
``sqrt(sum(x*x))`` before msprobe is imported; MindSpore's AdamW fails on CPU under msprobe, so the
AdamW update is written out in numpy and runs after ``debugger.stop()`` (no optimizer records).
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata
from pathlib import Path

#: the samples generator's MindSpore helpers (the same CPU workarounds): tools/samples/precnb_samples
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))


def apply_ms_shims(names: list[str]) -> None:
    """MindSpore 2.10 shims a release needs (``generate.py`` MS_SHIMS says which and why); after msprobe's import.

    ``ms_backward_hook_view``: 8.2.0-8.3.3 and 26.0.0-26.1.0.post1 decide whether MindSpore's
    ``CellBackwardHook.__call__`` takes one tuple by comparing version strings (``'2.10.0' < '2.7.0'``
    is true), and cache the answer in ``msprobe.mindspore.common.utils.is_output_of_backward_hook_a_view``.
    The cache is set to what the same function computes with the version compared as numbers.

    ``ms_cell_backward_hook_varargs``: 8.1.0-8.1.2's cell hooks call ``bw_hook(*args)``, MindSpore <= 2.6's
    ``CellBackwardHook`` API; from 2.7 it takes one tuple (:func:`_varargs_cell_backward_hook`).

    ``ms_no_dump_gradient``: 8.2.1-8.3.3 dump cells at level L0/mix in PyNative mode through MindSpore's own
    statistics dump when ``mindspore.ops.DumpGradient`` exists (``is_graph_mode_cell_dump_allowed``), which
    MindSpore 2.10 does not write on CPU. Hiding ``ops.DumpGradient`` makes the release take its hook-based
    cell dump (its path on a MindSpore without that operator, and 8.2.0's in PyNative mode), which writes
    ``dump.json`` as its API-level dumps do.
    """
    for name in names:
        if not name.startswith("ms_"):
            continue  # applied before msprobe's import (``_pt_worker.apply_shims``)
        if name == "ms_cell_backward_hook_varargs":
            _varargs_cell_backward_hook()
            continue
        if name == "ms_no_dump_gradient":
            from mindspore import ops

            if hasattr(ops, "DumpGradient"):
                delattr(ops, "DumpGradient")
            continue
        if name != "ms_backward_hook_view":
            raise ValueError(f"unknown shim {name!r}")
        import inspect

        import mindspore as ms
        import msprobe.mindspore.common.utils as msu
        from mindspore.ops.operations import _inner_ops as inner

        assert msu.is_output_of_backward_hook_a_view is None, "msprobe decided before the shim"
        numbers = tuple(int(p) for p in ms.__version__.split(".")[:2])
        params = inspect.signature(inner.CellBackwardHook.__call__).parameters
        msu.is_output_of_backward_hook_a_view = numbers >= (2, 7) and "args" in params and (
            params["args"].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _varargs_cell_backward_hook() -> None:
    """Let ``CellBackwardHook`` be called as ``bw_hook(*args)`` again (MindSpore <= 2.6), as 8.1.x's hooks do.

    From MindSpore 2.7 ``CellBackwardHook.__call__(self, args)`` takes one tuple (or one tensor, returned as a
    tensor); before, it took the tensors as separate arguments (one tensor returned as a tensor, several as a
    tuple). ``bw_hook(x)`` means the same in both; ``bw_hook(a, b)`` becomes ``bw_hook((a, b))``.
    """
    from mindspore.ops.operations import _inner_ops as inner

    new_call = inner.CellBackwardHook.__call__
    if getattr(new_call, "_matrix_varargs", False):
        return

    def call(self, *args):  # type: ignore[no-untyped-def]
        return new_call(self, args[0] if len(args) == 1 else args)

    call._matrix_varargs = True  # type: ignore[attr-defined]
    inner.CellBackwardHook.__call__ = call


def _build(ms, graph: str):  # type: ignore[no-untyped-def]
    import numpy as np
    from mindspore import Parameter, Tensor, nn, ops

    rng = np.random.default_rng(0)

    class Head(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc2 = nn.Dense(8, 4)
            self.fc2.weight.set_data(Tensor(rng.uniform(-0.35, 0.35, (4, 8)).astype(np.float32)))
            self.fc2.bias.set_data(Tensor(rng.uniform(-0.35, 0.35, (4,)).astype(np.float32)))

        def construct(self, h, mask):  # type: ignore[no-untyped-def]
            logits = ops.masked_fill(self.fc2(h), mask, float("-inf"))
            return logits, logits - logits  # NaN where the logits are -inf

    class TinyNet(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Dense(6, 8, has_bias=False)
            self.fc1.weight.set_data(Tensor(rng.uniform(-0.4, 0.4, (8, 6)).astype(np.float32)))
            self.act = nn.ReLU()
            self.head = Head()
            if graph == "jit":
                self.head.construct = ms.jit(self.head.construct)

        def construct(self, x, mask):  # type: ignore[no-untyped-def]
            h = self.act(self.fc1(x) + 0.5)
            logits, _ = self.head(h, mask)
            return logits

    net = TinyNet()
    for p in net.get_parameters():  # stable names for the update below
        assert isinstance(p, Parameter)
    data = np.random.default_rng(1)
    batches = [(Tensor(data.standard_normal((5, 6)).astype(np.float32)),
                Tensor(data.integers(0, 3, (5,)).astype(np.int32))) for _ in range(2)]
    mask_np = np.zeros((5, 4), np.bool_)
    mask_np[1::2, 3] = True
    return net, batches, Tensor(mask_np)


def main(spec_path: str) -> int:
    """Run the job described by *spec_path*; write its result JSON."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import mindspore as ms
    import numpy as np
    from mindspore import ops

    graph = spec["graph"]
    if graph == "graph":
        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU", jit_config={"jit_level": "O0"})
    else:
        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    from precnb_samples._ms_port_worker import _patch_norm

    _patch_norm()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _pt_worker import apply_shims  # the shims needed before msprobe's import (no torch imported)

    apply_shims([s for s in spec.get("shims", []) if not s.startswith("ms_")])
    from msprobe.mindspore import PrecisionDebugger

    # hiding DumpGradient is for the PyNative cell dump: jit cells and GRAPH_MODE keep the release's own choice
    apply_ms_shims([s for s in spec.get("shims", []) if graph == "pynative" or s != "ms_no_dump_gradient"])
    from precnb_samples._ms_model import adamw_numpy

    net, batches, mask = _build(ms, graph)
    params = net.trainable_params()

    def forward(x, y):  # type: ignore[no-untyped-def]
        return ops.cross_entropy(net(x, mask), y)

    grad_fn = ms.value_and_grad(forward, None, params)
    debugger = PrecisionDebugger(config_path=spec["config"])
    import inspect

    # 1.0.1-1.0.4 take the network as start(target=...), later releases as start(model=...)
    attach = "model" if "model" in inspect.signature(PrecisionDebugger.start).parameters else "target"
    state: dict[str, object] = {}
    losses = []
    for step in range(int(spec["steps"])):
        x, y = batches[step]
        debugger.start(**{attach: net})  # GRAPH_MODE too: without it 26.2.0 refuses ("The model is empty")
        loss, grads = grad_fn(x, y)
        debugger.stop()
        adamw_numpy(params, list(grads), state, step + 1, lr=0.05, weight_decay=0.01)
        debugger.step()
        losses.append(float(loss.asnumpy()))
    result = {"ranks": {"0": {"losses": losses, "attach": f"start({attach}=net)", "pid": os.getpid()}},
              "versions": {"mindspore": ms.__version__, "numpy": np.__version__,
                           "mindstudio-probe": metadata.version("mindstudio-probe"),
                           "python": sys.version.split()[0]}}
    Path(spec["result"]).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Train the matrix's tiny PyTorch model for 2 steps under one msprobe release (a standalone script).

Run by ``generate.py`` with the interpreter of the release's venv (``/work/venvs/msprobe-<version>``)::

    /work/venvs/msprobe-<version>/bin/python tools/msprobe_matrix/_pt_worker.py spec.json

It imports torch and msprobe, never precnb. ``spec.json``: ``config`` (the msprobe config.json path),
``world_size`` (1, or 2 for a gloo run with ``rank<R>`` folders), ``steps``, ``shims`` (see
:func:`apply_shims`) and ``result`` (a JSON file written at the end: losses per rank, versions, how the
debugger was attached).

The model (identical in every release; the weights and batches do not depend on msprobe's seeding):
``fc1`` (Linear 6->8, no bias), an in-place ``add_`` on its output, ``act`` (ReLU module), ``fc2`` (Linear
8->4, with bias), ``masked_fill(mask, -inf)`` on the logits (Infinity literals: Min/Mean ``-Infinity``, Norm
``Infinity``), and ``logits - logits`` (NaN literals; not part of the loss). Cross-entropy loss,
AdamW (``foreach=False``: the single-tensor update, whose in-place ops msprobe hooks; the
optimizer step runs before ``debugger.stop()``, so level L1/mix dumps record it), 1 thread,
deterministic algorithms.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import sys
from importlib import metadata
from pathlib import Path


def apply_shims(names: list[str]) -> None:
    """Compatibility shims a release needs with torch 2.13 (``generate.py`` SHIMS says which and why).

    ``torch.Any``: 1.0.1 annotates return values with ``torch.Any`` (the ``typing.Any`` that torch's
    ``__init__`` once re-exported, gone in torch 2.13); only an annotation, so ``typing.Any`` is it.
    ``mindspore._MindsporeFunctionExecutor`` (MindSpore dumps and their compare, 1.0.3-1.2.1): their
    ``msprobe/mindspore/dump/jit_dump.py`` imports ``_MindsporeFunctionExecutor`` from
    ``mindspore.common.api``, which MindSpore renamed ``_JitExecutor``; the old name is made the new class,
    as 1.2.2's ``jit_dump.py`` does itself (``except ImportError: from mindspore.common.api import
    _JitExecutor as _MindsporeFunctionExecutor``). Set before msprobe is imported.
    """
    for name in names:
        if name == "torch.Any":
            import typing

            import torch

            if not hasattr(torch, "Any"):
                torch.Any = typing.Any  # type: ignore[attr-defined]
        elif name == "mindspore._MindsporeFunctionExecutor":
            import mindspore.common.api as ms_api

            if not hasattr(ms_api, "_MindsporeFunctionExecutor"):  # what 1.2.2's jit_dump.py falls back to
                ms_api._MindsporeFunctionExecutor = ms_api._JitExecutor  # type: ignore[attr-defined]
        elif name.startswith("ms_"):
            continue  # a MindSpore dump-side shim (``_ms_worker.apply_ms_shims``); a compare does not need it
        else:
            raise ValueError(f"unknown shim {name!r}")


def _model_and_data(torch):  # type: ignore[no-untyped-def]
    nn = torch.nn

    class TinyNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(6, 8, bias=False)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(8, 4)

        def forward(self, x, mask):  # type: ignore[no-untyped-def]
            h = self.fc1(x)
            h.add_(0.5)  # an in-place op on an activation
            h = self.act(h)
            logits = self.fc2(h).masked_fill(mask, float("-inf"))
            _ = logits - logits  # NaN where the logits are -inf (dumped, not used)
            return logits

    torch.manual_seed(0)
    model = TinyNet()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):  # step-major, then rank: (step, rank) -> batch index step * 2 + rank
        x = torch.randn(5, 6, generator=gen)
        y = torch.randint(0, 3, (5,), generator=gen)  # class 3 is masked on some rows: never a target
        batches.append((x, y))
    mask = torch.zeros(5, 4, dtype=torch.bool)
    mask[1::2, 3] = True
    return model, batches, mask


def _attach(debugger_cls, config: str, model):  # type: ignore[no-untyped-def]
    """The debugger and how to start it: releases before 1.1.0 take the model in the constructor only."""
    start_params = inspect.signature(debugger_cls.start).parameters
    if "model" in start_params:
        return debugger_cls(config_path=config), (lambda d: d.start(model=model)), "start(model=model)"
    return debugger_cls(config_path=config, model=model), (lambda d: d.start()), "PrecisionDebugger(model=model)"


def _run(rank: int, spec: dict) -> None:  # type: ignore[type-arg]
    import torch
    import torch.nn.functional as F  # noqa: N812

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = int(spec["world_size"])
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world)
    model, batches, mask = _model_and_data(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01, foreach=False)
    apply_shims(spec.get("shims", []))
    from msprobe.pytorch import PrecisionDebugger

    debugger, start, how = _attach(PrecisionDebugger, spec["config"], model)
    losses = []
    for step in range(int(spec["steps"])):
        x, y = batches[step * 2 + rank]
        opt.zero_grad(set_to_none=True)
        start(debugger)
        loss = F.cross_entropy(model(x, mask), y)
        loss.backward()
        if world > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        opt.step()
        debugger.stop()
        debugger.step()
        losses.append(float(loss.detach()))
    out = Path(spec["result"]).with_suffix(f".rank{rank}.json")
    out.write_text(json.dumps({"losses": losses, "attach": how, "pid": os.getpid()}), encoding="utf-8")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(spec_path: str) -> int:
    """Run the job described by *spec_path*; write its result JSON."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    world = int(spec["world_size"])
    if world == 1:
        _run(0, spec)
    else:
        import torch.multiprocessing as mp

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        spec["port"] = _free_port()
        mp.spawn(_run, args=(spec,), nprocs=world, join=True)
    import torch

    ranks = {}
    for r in range(world):
        part = Path(spec["result"]).with_suffix(f".rank{r}.json")
        ranks[str(r)] = json.loads(part.read_text(encoding="utf-8"))
        part.unlink()
    result = {"ranks": ranks, "versions": {"torch": torch.__version__, "mindstudio-probe": metadata.version(
        "mindstudio-probe"), "python": sys.version.split()[0], "numpy": metadata.version("numpy")}}
    Path(spec["result"]).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

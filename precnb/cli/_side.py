"""What several commands share about the inputs read beside a run: ``--monitor DIR`` and ``--loss FILE`` (#29).

``spike``, ``anomalies``, ``report`` and ``plan`` take them; ``anomalies`` also shows the loss spike
beside its own finding (:func:`with_loss_spike`).
"""

from __future__ import annotations

import argparse
from typing import Any

from precnb.cli import _term
from precnb.cli._args import existing_folder

__all__ = ["add_side_options", "side_options", "with_loss_spike"]


def side_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``monitor`` / ``loss`` pipeline options a command line gave."""
    out: dict[str, Any] = {}
    if getattr(args, "monitor", None):
        out["monitor"] = args.monitor
    if getattr(args, "loss", None):
        out["loss"] = args.loss
    return out


def add_side_options(p: argparse.ArgumentParser) -> None:
    """``--monitor DIR`` and ``--loss FILE``: read beside the run."""
    p.add_argument("--monitor", type=existing_folder, metavar="DIR",
                   help="msprobe monitor output (TrainerMon) of the same job, read beside RUN")
    p.add_argument("--loss", metavar="FILE",
                   help="loss log of every step: CSV step,loss[,rank], or TensorBoard event files (a file or a folder)")


def with_loss_spike(triage: Any, args: argparse.Namespace) -> int:
    """``precnb anomalies``: the anomaly finding, with the loss spike beside it when one is found.

    ``--json`` prints the anomaly finding (its shape unchanged) with ``values["loss_spike"]``
    (step, rank, origin, first cause) and a hint; the text prints both findings.
    """
    from precnb.analysis.diagnoses import ANOMALY
    from precnb.analysis.spike.diagnosis import LOSS_SPIKE

    anomaly = triage.result(ANOMALY) or triage.finding
    spike = triage.result(LOSS_SPIKE)
    if spike is not None and spike.found:
        first = spike.causes[0] if spike.causes else {}
        anomaly.values[LOSS_SPIKE] = {"step": spike.step, "rank": spike.rank, "node": spike.node,
                                        "tensor": spike.tensor, "module": spike.module,
                                        "cause": first.get("cause"), "certain": first.get("certain")}
        anomaly.hints.append(f"loss spike at step {spike.step}"
                             + (f" (origin rank {spike.rank})" if spike.rank is not None else "")
                             + (f": {first.get('cause')}" if first else "") + " — `precnb spike` explains it")
    if args.json:
        _term.out(anomaly.to_json(indent=2) + "\n")
    else:
        shown = [anomaly] + ([spike] if spike is not None and spike.found else [])
        _term.out("\n\n".join(f.summary(_term.WIDTH) for f in shown) + "\n")
    return 0



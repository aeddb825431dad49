"""The parsers of the analysis sub-commands and the options they share with other sub-commands.

``diff``, ``align`` and ``merge``; :mod:`precnb.cli.analysis_cmds` runs them (``preflight``, ``nan``, ``anomalies``,
``replicas`` and ``spike`` are generated from the diagnosis registry: :mod:`precnb.cli.generated`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from precnb.cli._args import MAX_INDEX, integer, layout_text, number, order_text
from precnb.cli._common import int_or_auto

__all__ = [
    "add_align_parser",
    "add_diff_parser",
    "add_layout_options",
    "add_mapping_option",
    "add_merge_parser",
    "add_rank_table_option",
    "add_rng_region_option",
    "add_step_offset_option",
]

positive = number(0)
step = integer(0, MAX_INDEX)
size = integer(1, 2**20)


def add_rank_table_option(p: argparse.ArgumentParser) -> None:
    """``--rank-table FILE``: which host and device served each rank (issue #28)."""
    p.add_argument("--rank-table", metavar="FILE",
                   help="HCCL rank_table_file JSON or a rank,host,device CSV: every finding naming a rank "
                        "names its host and device too")


def add_rng_region_option(p: argparse.ArgumentParser) -> None:
    """``--rng-region MODULE`` (repeatable): module paths inside a model-parallel RNG region (issue #28)."""
    p.add_argument("--rng-region", action="append", metavar="MODULE",
                   help="module path (prefix) inside a model-parallel RNG region, e.g. blocks.0.attn: a random "
                        "op there differs across TP ranks by design (repeatable)")


def add_mapping_option(p: argparse.ArgumentParser) -> None:
    """``--mapping FILE`` (repeatable): msprobe layer/cell/API/data mapping YAML or precnb's own mapping file."""
    p.add_argument("--mapping", action="append", metavar="FILE",
                   help="name-mapping file (repeatable; msprobe layer / cell / API / data mapping YAML or "
                        "precnb's own from `precnb align -o`; its kind is detected); names that differ are "
                        "aligned automatically without one")


def add_step_offset_option(p: argparse.ArgumentParser) -> None:
    """``--step-offset N|auto``: target step = baseline step + OFFSET."""
    p.add_argument("--step-offset", type=int_or_auto(), default=None,
                   help="target step = baseline step + OFFSET, or 'auto' (resumed runs); default: 0 when "
                        "both runs hold the same steps, else auto")


def add_layout_options(p: argparse.ArgumentParser) -> None:
    """``--layout`` or ``--tp/--pp/--vpp/--cp/--ep/--etp``, ``--order``, ``--num-layers``: a run's parallel layout."""
    p.add_argument("--layout", type=layout_text,
                   help="layout as text, e.g. tp=2,pp=2 or tp=2,ep=2,etp=1 (instead of the flags below)")
    for dim in ("tp", "pp", "vpp", "cp", "ep"):
        p.add_argument(f"--{dim}", type=size, default=None,
                       help=f"{dim.upper()} size (default: read from the dumps, else 1)")
    p.add_argument("--etp", type=size, default=None,
                   help="expert tensor-parallel size (default: tp as in Megatron; 1 when ep is folded onto tp)")
    p.add_argument("--order", type=order_text, default="tp-cp-ep-dp-pp", help="Megatron order string")
    p.add_argument("--num-layers", type=size, help="total layers, for PP/VPP renumbering")



def add_diff_parser(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> Any:
    """The ``diff`` sub-command's parser."""
    p = sub.add_parser("diff", help="first divergence between a baseline and a target run")
    p.add_argument("baseline")
    p.add_argument("target", nargs="?", help="omit when BASELINE holds two runs (a compare result CSV)")
    p.add_argument("--json", action="store_true", help="print one JSON finding")
    p.add_argument("--step", type=step, help="only this step")
    p.add_argument("--step-offset", type=int_or_auto(), default=None,
                   help="target step = baseline step + OFFSET, or 'auto' (resumed runs); default: 0 when "
                        "both runs hold the same steps, else auto")
    p.add_argument("--rtol", type=positive, help="one relative tolerance for all tensors "
                   "(default: by dtype, bf16 2^-8, fp16 2^-11, fp32 2^-14)")
    p.add_argument("--reference", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="calibrate tolerances from two healthy runs of the same job")
    p.add_argument("--crc-strict", action="store_true",
                   help="count CRC differences with identical statistics as divergence")
    p.add_argument("--no-tensor-metrics", action="store_true",
                   help="judge on statistics only, even where both runs saved the tensors (task=tensor)")
    p.add_argument("--baseline-layout", type=layout_text, help="merge baseline shards first, e.g. tp=2,pp=2")
    p.add_argument("--target-layout", type=layout_text, help="merge target shards first, e.g. tp=2")
    p.add_argument("--layout", type=layout_text, help="same as --target-layout (the target's layout)")
    add_mapping_option(p)
    add_rank_table_option(p)
    add_load_options(p)
    return p


def add_align_parser(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> Any:
    """The ``align`` sub-command's parser."""
    p = sub.add_parser("align", help="pair the modules, nodes and tensors of two runs whose names differ",
                       description="Align BASELINE and TARGET (a framework port, renamed modules, pipeline stages): "
                                   "module pairs, then API calls inside them, then tensors, without a mapping file "
                                   "in the common cases. Prints the counts, the module pairs and the least "
                                   "confident pairs; -o writes precnb's own mapping file (edit it, reuse it with "
                                   "--mapping).")
    p.add_argument("baseline")
    p.add_argument("target")
    p.add_argument("-o", "--output", help="write precnb's mapping file (JSON) here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing precnb mapping file")
    p.add_argument("--json", action="store_true", help="print the alignment as one JSON object")
    p.add_argument("--baseline-layout", type=layout_text, help="merge baseline shards first, e.g. tp=2,pp=2")
    p.add_argument("--target-layout", type=layout_text, help="merge target shards first, e.g. pp=2")
    p.add_argument("--layout", type=layout_text, help="same as --target-layout")
    add_mapping_option(p)
    add_load_options(p)
    return p


def add_merge_parser(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> Any:
    """The ``merge`` sub-command's parser."""
    p = sub.add_parser("merge", help="merge TP/CP shards (and PP/VPP/EP stages) into whole-layer statistics")
    p.add_argument("run")
    p.add_argument("-o", "--output", help="zarr store to write (e.g. merged.zarr)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store precnb wrote (never "
                                                            "anything else)")
    p.add_argument("--reference", help="an unsharded run: names split dims, spots partial sums by shape")
    p.add_argument("--json", action="store_true")
    p.add_argument("--step", type=step, help="only this step")
    add_layout_options(p)
    add_load_options(p)
    return p

"""The canonical precnb dataset contract.

Every reader in :mod:`precnb.io` returns an :class:`xarray.Dataset` that passes
:func:`validate`; every analysis function in :mod:`precnb.analysis` may rely on it.

Dimensions
----------
``step`` (int64), ``rank`` (int64), ``tensor`` (str) and, when several runs are
combined by :func:`precnb.open_runs`, a leading ``run`` (str).

Coordinates along ``tensor``
----------------------------
``node``       node record name (``Functional.linear.0.forward``)
``module``     module path (``blocks.1.attn``), ``""`` when unknown
``api``        API name (``Functional.linear``) or module class (``Linear``)
``kind``       one of :data:`KINDS`
``direction``  one of :data:`DIRECTIONS`
``role``       one of :data:`ROLES`
``dtype``      dtype string as written by the producer (``torch.float32``)
``shape``      shape as JSON text (``"[4, 16, 32]"``), first seen
``parent``     parent node from construct.json (``""`` for roots / unknown)
``call``       call counter parsed from the node name (-1 when none)
``micro_step`` Megatron / monitor micro step (-1 when none)

Data variables over (step, rank, tensor)
----------------------------------------
``max``, ``min``, ``mean``, ``norm``  float64; NaN and ±inf exactly as in the file
``present``    bool; False where the tensor was not recorded at that (step, rank)
``null_stats`` uint8 bit mask of statistics that were recorded as ``null``
               (bit 0 max, 1 min, 2 mean, 3 norm); absent ≠ null ≠ NaN
``seq``        int32 position in execution (dump) order within (step, rank); -1 absent
``numel``      int64 element count from the shape; -1 absent
``crc``        str checksum (md5 mode), ``""`` where absent — only when recorded
``nans``, ``zeros``, ...  extra float64 monitor / kernel statistics where they exist

Attributes
----------
``precnb_schema`` (:data:`SCHEMA_VERSION`), ``source_format``, ``task``, ``level``,
``framework``, ``source`` (path), and JSON text side tables ``construct``
(node → parent) and ``stacks`` (node → list of frames). ``dtype_changes`` (JSON text, only
when some entry's dtype differs from its tensor's ``dtype`` coordinate, e.g. an op cast to
bfloat16 from step 1 on one rank): tensor → {dtype → [[step, rank], ...]}; read it with
:func:`entry_dtype` / :func:`dtype_changes`. ``meta_changes`` (JSON text, only when some entry's
``module``, ``parent`` or ``shape`` differs from its tensor's coordinate, e.g. a rank whose call
counters are shifted by one extra op, so that one label names another op there): field → tensor →
{value → [[step, rank], ...]}; ``stack_changes`` (JSON text, the same for stack.json): node →
[[frames, [[step, rank], ...]], ...]. Read them with :func:`entry_meta` / :func:`entry_stack`:
the metadata of one (step, rank, tensor) entry is that rank's own. MindSpore tensor-layout kernel dumps
(``source_format == "kernel_tensors"``) add ``kernel_order`` (how ``seq`` was ordered) and
``kernel_parameters`` (JSON text: tensor label of a kernel input → the parameter it reads).
Run facts outside the statistics, JSON text, only when the source holds them (read with
:func:`side_table`): ``requires_grad`` (parameter tensor label → bool; false when any file
records ``requires_grad: false``) and ``scalar_args`` (optimizer op API → argument (keyword
name or positional index) → step → distinct values, e.g. ``{"Torch._fused_adamw_": {"lr":
{"0": [0.01]}}}``; non-finite floats as ``"nan"``/``"inf"``/``"-inf"``). A ``config_check``
pack (:mod:`precnb.io.config_check`) adds ``config_check``: what the pack holds besides
tensors (environment, packages, hyper-parameters, random-call records).

Examples
--------
>>> from precnb.schema import empty_dataset, validate
>>> ds = empty_dataset()
>>> validate(ds) is ds
True
"""

from __future__ import annotations

from precnb.schema._core import (
    DIMS,
    DIRECTIONS,
    ENTRY_CHANGE_ATTRS,
    KINDS,
    META_FIELDS,
    NULL_BITS,
    ROLES,
    SCHEMA_VERSION,
    STATS,
    TENSOR_COORDS,
    SchemaError,
    empty_dataset,
    validate,
)
from precnb.schema._entries import (
    dtype_changes,
    encode_dtype_changes,
    encode_entry_changes,
    encode_meta_changes,
    encode_stack_changes,
    encode_undefined,
    entry_changes,
    entry_dtype,
    entry_meta,
    entry_stack,
    meta_changes,
    read_side_table,
    shift_entry_changes,
    stack_changes,
    undefined_table,
)
from precnb.schema._side import side_table, side_text

__all__ = [
    "DIMS",
    "DIRECTIONS",
    "ENTRY_CHANGE_ATTRS",
    "KINDS",
    "META_FIELDS",
    "NULL_BITS",
    "ROLES",
    "SCHEMA_VERSION",
    "STATS",
    "TENSOR_COORDS",
    "SchemaError",
    "dtype_changes",
    "empty_dataset",
    "encode_dtype_changes",
    "encode_entry_changes",
    "encode_meta_changes",
    "encode_stack_changes",
    "encode_undefined",
    "entry_changes",
    "entry_dtype",
    "entry_meta",
    "entry_stack",
    "meta_changes",
    "read_side_table",
    "shift_entry_changes",
    "side_table",
    "side_text",
    "stack_changes",
    "undefined_table",
    "validate",
]

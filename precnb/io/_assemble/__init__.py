"""Assembly of per-file records into the canonical dataset (any reader, any format).

Every reader turns one (step, rank) source into a :class:`~precnb.io.records.FileRecords` and
hands it to an :class:`Assembler` (or :func:`assemble`), which aligns the records on the union of
tensor labels. Nothing here knows a file format: side tables arrive as dicts or as
:class:`~precnb.io.records.SharedTable` objects parsed once per distinct content.

Labels become integer ids as records arrive and columns are kept as numpy arrays, so a record
of millions of tensors is folded in with array operations, not a Python step per tensor.
"""

from __future__ import annotations

from precnb.io._assemble._base import select_items
from precnb.io._assemble._changes import MAX_DTYPE_CHANGES, MAX_META_CHANGES
from precnb.io._assemble.assembler import Assembler, assemble, dataset
from precnb.io.records import FileRecords, LoadReport, RecordBuilder, SharedTable, dedup_labels, stat_value

__all__ = ["MAX_DTYPE_CHANGES", "MAX_META_CHANGES", "Assembler", "FileRecords", "LoadReport", "RecordBuilder",
           "SharedTable", "assemble", "dataset", "dedup_labels", "select_items", "stat_value"]

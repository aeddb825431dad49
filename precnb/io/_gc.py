"""The cyclic garbage collector paused while a reader builds millions of fresh, acyclic objects.

Parsing a large dump creates millions of containers (JSON objects, lists, label strings, tuples)
and no reference cycles; with the collector on, each full collection walks every one of them
again, which costs more than the parse itself on a gigabyte file. :func:`paused_gc` switches it
off for the duration of a load (nested uses are fine) and back on afterwards if it was on.

Examples
--------
>>> import gc
>>> with paused_gc():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Switch the cyclic garbage collector off inside the block (reference counting still frees memory)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()

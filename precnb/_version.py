"""The package version, in a module of its own.

Every layer may read it (the CLI's ``--version``, the markers on precnb's outputs, the report's
generator tag) without importing ``precnb/__init__.py``, whose lazy API (``precnb.open_run`` and
the rest, resolved by ``__getattr__``) would hide from the import contracts which layer a module
really uses. ``precnb.__version__`` is this value.

Examples
--------
>>> import precnb
>>> precnb.__version__ == __version__
True
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"

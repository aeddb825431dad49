"""``python -m precnb`` runs the CLI."""

import sys

from precnb.cli import main

sys.exit(main())

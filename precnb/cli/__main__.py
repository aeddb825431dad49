"""``python -m precnb.cli``."""

import sys

from precnb.cli import main

sys.exit(main())

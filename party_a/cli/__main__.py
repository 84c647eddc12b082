"""``python -m party_a.cli``: the same as ``fedlite-a``."""

import sys

from party_a.cli import main

sys.exit(main())

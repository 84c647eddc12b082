"""``python -m party_a.cli``: the same as ``fedlite-a``."""

import sys

from party_a.cli import main

if __name__ == "__main__":  # importing the module (e.g. walking the package) runs nothing
    sys.exit(main())

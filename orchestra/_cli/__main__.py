"""``python -m orchestra._cli COMMAND [ARGS]``: the ``orchestra`` command (main.py)."""
import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())

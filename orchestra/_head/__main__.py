"""``python -m orchestra._head CONFIG``: the head process (process.py)."""
from .process import main

if __name__ == "__main__":
    main()

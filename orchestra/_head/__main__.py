"""``python -m orchestra._head CONFIG``: the head process (head.py)."""
from .head import main

if __name__ == "__main__":
    main()

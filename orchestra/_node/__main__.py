"""``python -m orchestra._node CONFIG HEAD`` (or ``--join CFG``): a node in a process of its
own (process.py)."""
from .process import main

if __name__ == "__main__":
    main()

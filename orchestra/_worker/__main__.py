"""``python -m orchestra._worker SOCKET WORKER_ID``: a worker process started by exec
(worker.py), where the node has no fork server."""
from .worker import main

if __name__ == "__main__":
    main()

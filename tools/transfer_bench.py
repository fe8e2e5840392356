"""How fast an object's bytes move between two nodes' stores (orchestra/_objects/transfer.py).

    python tools/transfer_bench.py [--size-mib 200] [--small-kib 200] [--repeat 5]
                                   [--streams 1,2] (connections per object) [--no-netns]

The source object is a file in a private directory under /dev/shm (as a segment is);
a DataServer in a process of its own serves it; this process fetches it into a mapped
tmpfs file of the same size (a warm, pooled segment) and prints GB/s for the big
object, and the median time of the small one and of a 1-byte object (about one round
trip plus the request's own cost). Twice: over loopback, and from a server in a network
namespace of its own over a veth pair (needs root: `ip netns`; skipped, saying why,
otherwise).
"""
from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestra._objects.transfer import DataServer, Fetcher  # noqa: E402
from orchestra._protocol.auth import new_token  # noqa: E402

MiB = 1 << 20
NS = "orch-xfer-bench"
NS_HOST, NS_PEER = "10.213.77.1", "10.213.77.2"


# ---------------------------------------------------------------- the serving process


def serve(host: str, folder: str) -> None:
    """Serve the files of ``folder`` by name until stdin closes."""

    def resolve(key: str) -> tuple[str, int] | None:
        path = os.path.join(folder, key)
        if "/" in key or not os.path.isfile(path):
            return None
        return path, os.path.getsize(path)

    server = DataServer(host, os.environ["ORCHESTRA_TOKEN"], resolve)
    print(server.address, flush=True)
    sys.stdin.read()
    server.close()


def start_server(prefix: list[str], host: str, folder: str,
                 token: str) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, ORCHESTRA_TOKEN=token)
    proc = subprocess.Popen(prefix + [sys.executable, os.path.abspath(__file__), "--serve",
                                      host, folder],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    address = proc.stdout.readline().strip()
    if not address:
        raise SystemExit(f"the data server did not start (exit {proc.wait()})")
    return proc, address


# ---------------------------------------------------------------- measuring


def make_source(folder: str, name: str, size: int) -> None:
    block = os.urandom(MiB)
    with open(os.path.join(folder, name), "wb") as f:
        for off in range(0, size, MiB):
            f.write(block[: min(MiB, size - off)])


def destination(folder: str, size: int) -> mmap.mmap:
    """A mapped tmpfs file with its pages in place, like a pooled segment."""
    path = os.path.join(folder, f"dest-{size}")
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
    return mm


def measure(label: str, address: str, token: str, folder: str, args: argparse.Namespace,
            sizes: dict[str, int]) -> None:
    big = sizes["big"]
    mm = destination(folder, big)
    view = memoryview(mm)
    expected = open(os.path.join(folder, "big"), "rb").read(MiB)
    for streams in args.streams:
        fetcher = Fetcher()
        fetcher.fetch(address, token, "big", big, view, streams=streams)   # connect, warm up
        assert view[:MiB] == expected, "fetched bytes differ from the source"
        rates = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fetcher.fetch(address, token, "big", big, view, streams=streams)
            rates.append(big / (time.perf_counter() - t0) / 1e9)
        fetcher.close()
        print(f"{label:9s} {big // MiB} MiB, {streams} stream(s): "
              f"median {statistics.median(rates):.2f} GB/s, best {max(rates):.2f} "
              f"(n={args.repeat})", flush=True)
    view.release()
    mm.close()
    fetcher = Fetcher()
    for name in ("small", "one"):
        size = sizes[name]
        buf = memoryview(bytearray(size))
        fetcher.fetch(address, token, name, size, buf)
        times = []
        for _ in range(args.small_repeat):
            t0 = time.perf_counter()
            fetcher.fetch(address, token, name, size, buf)
            times.append(time.perf_counter() - t0)
        what = f"{size // 1024} KiB" if size >= 1024 else f"{size} B"
        print(f"{label:9s} {what}: median {statistics.median(times) * 1e6:.0f} us, "
              f"p90 {sorted(times)[int(len(times) * 0.9)] * 1e6:.0f} us "
              f"(n={args.small_repeat})", flush=True)
    fetcher.close()


def run_loopback(folder: str, token: str, args: argparse.Namespace,
                 sizes: dict[str, int]) -> None:
    proc, address = start_server([], "127.0.0.1", folder, token)
    try:
        measure("loopback", address, token, folder, args, sizes)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


def run_netns(folder: str, token: str, args: argparse.Namespace,
              sizes: dict[str, int]) -> None:
    """Server in a namespace of its own, this process in the root one, a veth between."""
    if os.geteuid() != 0:
        print("netns     skipped: creating network namespaces needs root")
        return
    if shutil.which("ip") is None:
        print("netns     skipped: no `ip` command (iproute2)")
        return
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    subprocess.run(["ip", "link", "del", "oxb0"], capture_output=True)
    try:
        _ip("netns", "add", NS)
        _ip("link", "add", "oxb0", "type", "veth", "peer", "name", "oxb1")
        _ip("link", "set", "oxb1", "netns", NS)
        _ip("addr", "add", f"{NS_PEER}/30", "dev", "oxb0")
        _ip("link", "set", "oxb0", "up")
        _ip("netns", "exec", NS, "ip", "addr", "add", f"{NS_HOST}/30", "dev", "oxb1")
        _ip("netns", "exec", NS, "ip", "link", "set", "oxb1", "up")
        _ip("netns", "exec", NS, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        print(f"netns     skipped: {' '.join(exc.cmd)} failed: {exc.stderr.strip()}")
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        return
    try:
        proc, address = start_server(["ip", "netns", "exec", NS], NS_HOST, folder, token)
        try:
            measure("netns", address, token, folder, args, sizes)
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)
    finally:
        subprocess.run(["ip", "link", "del", "oxb0"], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def run_node_pull(token: str, args: argparse.Namespace, sizes: dict[str, int]) -> None:
    """Node.pull end to end over loopback: two Nodes on one loop in this process; three
    pulls into fresh segments (none freed meanwhile), then pulls into a pooled (warm)
    one, each freed after."""
    import asyncio

    from orchestra._node.node import Node
    from orchestra._objects.segments import open_segment

    loop = asyncio.new_event_loop()
    done: list[tuple[bytes, object, str]] = []

    class Host:
        def send(self, *a: object) -> None: ...
        def flush(self) -> None: ...
        def worker_failed_to_start(self, *a: object) -> None: ...
        def worker_exited(self, *a: object, **kw: object) -> None: ...
        def relocate(self, *a: object) -> bool: return True
        def is_idle(self) -> bool: return False
        def pulled(self, oid: bytes, seg: object, error: str) -> None:
            done.append((oid, seg, error))
            loop.stop()

    folder = tempfile.mkdtemp(prefix="orchestra-xfer-nodes-", dir="/dev/shm")
    big = sizes["big"]
    nodes = [Node(i, Host(), loop, session_id="bench", session_dir=folder,
                  sock_path=os.path.join(folder, "s"), capacity=4 * big) for i in (2, 3)]
    src, dst = nodes
    try:
        for size in (big, sizes["small"]):
            seg = src.store.create(1, b"src", size)
            mm = open_segment(src.shm_dir, seg)
            mm.write(os.urandom(min(size, MiB)) * max(1, size // MiB))
            mm.close()
            src.seal(seg.name)
            address = src.serve_data("127.0.0.1", token)
            def pull(oid: bytes, address: str = address, key: str = seg.name,
                     size: int = size) -> tuple[float, str]:
                """One pull into ``dst``: its seconds and the segment it filled."""
                t0 = time.perf_counter()
                dst.pull(oid, address, key, size, token)
                loop.run_forever()
                took = time.perf_counter() - t0
                _, copy, error = done.pop()
                assert not error, error
                return took, copy.name
            # Each into a segment of its own, none freed meanwhile; then each freed after
            # (pooled: the next pull reuses it).
            fresh = [pull(b"f%d" % i) for i in range(3)] if size == big else []
            for _, name in fresh:
                dst.free_segment(name)
            times = []
            for i in range(args.repeat if size == big else args.small_repeat):
                took, name = pull(b"o%d" % i)
                times.append(took)
                dst.free_segment(name)
            if size == big:
                print(f"node pull {size // MiB} MiB: fresh segments "
                      + " ".join(f"{size / t / 1e9:.2f}" for t, _ in fresh)
                      + f" GB/s, pooled median {size / statistics.median(times[1:]) / 1e9:.2f} "
                      f"GB/s (n={len(times) - 1})", flush=True)
            else:
                print(f"node pull {size // 1024} KiB: median "
                      f"{statistics.median(times[1:]) * 1e6:.0f} us (n={len(times) - 1})",
                      flush=True)
            src.free_segment(seg.name)
    finally:
        for node in nodes:
            node.close()
        loop.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=200)
    p.add_argument("--small-kib", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--small-repeat", type=int, default=300)
    p.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--no-netns", action="store_true")
    args = p.parse_args()
    token = new_token()
    folder = tempfile.mkdtemp(prefix="orchestra-xfer-bench-", dir="/dev/shm")
    sizes = {"big": args.size_mib * MiB, "small": args.small_kib * 1024, "one": 1}
    try:
        for name, size in sizes.items():
            make_source(folder, name, size)
        run_loopback(folder, token, args, sizes)
        run_node_pull(token, args, sizes)
        if not args.no_netns:
            run_netns(folder, token, args, sizes)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Regenerate orchestra/_proto from protos/, or check that the committed code is current.

    python tools/gen_protos.py           # write orchestra/_proto/*_pb2*.py
    python tools/gen_protos.py --check   # exit 1 when the committed files are stale

The .proto paths mirror the package path (protos/orchestra/_proto/x.proto ->
orchestra/_proto/x_pb2.py) so generated imports resolve without edits.
"""
from __future__ import annotations

import argparse
import filecmp
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    from grpc_tools import protoc  # dev dependency: grpcio-tools

    protos = sorted((ROOT / "protos").rglob("*.proto"))
    args = ["protoc", f"-I{ROOT / 'protos'}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}"] + [str(p) for p in protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out) for p in out.rglob("*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(pathlib.Path(tmp))
        stale = [f for f in files if not (ROOT / f).exists()
                 or not filecmp.cmp(pathlib.Path(tmp) / f, ROOT / f, shallow=False)]
        if ns.check:
            if stale:
                print("stale generated code:", *map(str, stale), sep="\n  ")
                print("run: tox -e protos  (or python tools/gen_protos.py)")
                return 1
            print(f"{len(files)} generated files are current")
            return 0
        for f in files:
            shutil.copyfile(pathlib.Path(tmp) / f, ROOT / f)
        print(f"wrote {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

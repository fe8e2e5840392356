"""Code copied by value keeps its file name and source lines, for remote tracebacks.

    driver: dumps_by_value(fn) -> cloudpickle with each code object's real file name,
        and the source lines of those files (as linecache has them here: a script's
        file, or a notebook cell IPython registered) -> _WithSource(pickle, lines)
    worker: loads -> the lines into linecache (before the code exists) -> the function

cloudpickle (>= 3) copies functions and classes of ``__main__`` or a notebook by value
and writes every code object's file name as ``<dynamic-code>`` (a payload independent
of where the code was defined), so a remote traceback read ``File "<dynamic-code>",
line 6, in f`` without its line. With the file name kept and the lines shipped, it reads
``File "/path/script.py", line 6, in f`` and the line, on any node, even where the file
does not exist (another machine, a notebook's cell).
"""
from __future__ import annotations

import io
import linecache
import pickle
import types
from collections import ChainMap
from typing import IO, Any

import cloudpickle

# Source shipped per function at most (larger files: the names and line numbers only).
_MAX_SOURCE = 1 << 20
_DYNAMIC = "<dynamic-code>"


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, keeping code objects' file names (and noting them)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.filenames: set[str] = set()
        # Looked up by pickle per type; an instance's table, so _code can note names.
        self.dispatch_table = ChainMap({types.CodeType: self._code},
                                       cloudpickle.Pickler.dispatch_table)
        super().__init__(file, protocol=5)

    def _code(self, code: types.CodeType) -> Any:
        fn, args = cloudpickle.cloudpickle._code_reduce(code)
        i = args.index(_DYNAMIC)
        self.filenames.add(code.co_filename)
        return fn, args[:i] + (code.co_filename,) + args[i + 1:]


def dumps_by_value(obj: object) -> bytes:
    """cloudpickle.dumps(obj) with file names and source lines kept (see above); as
    cloudpickle.dumps where that fails (its error is the one raised)."""
    buf = io.BytesIO()
    try:
        pickler = _Pickler(buf)
        pickler.dump(obj)
    except Exception:  # noqa: BLE001 - cloudpickle's own path gives its own error
        return cloudpickle.dumps(obj, protocol=5)
    sources = _sources(pickler.filenames)
    if not sources:
        return buf.getvalue()
    return pickle.dumps(_WithSource(buf.getvalue(), sources), protocol=5)


def _sources(filenames: set[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    size = 0
    for name in sorted(filenames):
        lines = linecache.getlines(name)
        n = sum(map(len, lines))
        if lines and size + n <= _MAX_SOURCE:
            out[name] = lines
            size += n
    return out


class _WithSource:
    __slots__ = ("data", "sources")

    def __init__(self, data: bytes, sources: dict[str, list[str]]) -> None:
        self.data, self.sources = data, sources

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_with_source, (self.data, self.sources))


def _load_with_source(data: bytes, sources: dict[str, list[str]]) -> Any:
    for name, lines in sources.items():
        # mtime None: linecache.checkcache keeps the entry (no file to compare with).
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)
    return cloudpickle.loads(data)

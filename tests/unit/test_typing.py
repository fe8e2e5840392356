"""orchestra's hints as a user's type checker reads them: mypy, run on a small user
file, must find what each ``assert_type`` says and an error at each ``type: ignore``
(``--warn-unused-ignores`` turns a missing error into one). Under tox, mypy reads the
installed package, so this also checks that the wheel carries ``py.typed``.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import orchestra

pytestmark = pytest.mark.timeout(120)

pytest.importorskip("mypy", reason="mypy is in the test extras: pip install .[test]")

USER_FILE = textwrap.dedent('''
    from collections.abc import Iterator
    from typing import Any

    from typing_extensions import assert_type

    import orchestra
    from orchestra import ActorClass, ActorHandle, ObjectRef, ObjectRefGenerator, RemoteFunction


    @orchestra.remote
    def scale(x: int, factor: float = 2.0) -> float:
        return x * factor


    @orchestra.remote(num_cpus=1, max_retries=0)
    def words(text: str) -> list[str]:
        return text.split()


    @orchestra.remote
    def count_to(n: int) -> Iterator[int]:
        yield from range(n)


    class Counter:
        def __init__(self, start: int) -> None:
            self.n = start

        def inc(self) -> int:
            self.n += 1
            return self.n


    # mypy keeps a decorated class's own type whatever the decorator returns
    # (python/mypy#3135): the call form gives the actor class its type.
    RemoteCounter = orchestra.remote(Counter)
    Pinned = orchestra.remote(num_cpus=1)(Counter)


    # .remote keeps the function's parameters, and the ref its return type
    assert isinstance(scale, RemoteFunction)
    assert_type(scale.remote(1), ObjectRef[float])
    assert_type(scale.remote(1, factor=0.5), ObjectRef[float])
    assert_type(words.remote("a b"), ObjectRef[list[str]])
    assert_type(scale.options(num_cpus=2).remote(3), ObjectRef[float])
    scale.remote("1")          # type: ignore[arg-type]
    scale.remote(1, fctor=1)   # type: ignore[call-arg]
    scale.remote()             # type: ignore[call-arg]

    # a generator function streams its items' refs
    assert_type(count_to.remote(3), ObjectRefGenerator[int])
    for item in count_to.remote(3):
        assert_type(item, ObjectRef[int])
        assert_type(orchestra.get(item), int)
    count_to.remote("3")       # type: ignore[call-overload]

    # get: a ref's value, a list's values
    assert_type(orchestra.get(scale.remote(1)), float)
    assert_type(orchestra.get(scale.remote(1), timeout=5, progress=True), float)
    assert_type(orchestra.get([scale.remote(1), scale.remote(2)]), list[float])
    assert_type(orchestra.get([words.remote("a")], progress="words"), list[list[str]])
    bad: int = orchestra.get(words.remote("a"))   # type: ignore[assignment]

    # put, wait, as_completed
    assert_type(orchestra.put({"a": 1}), ObjectRef[dict[str, int]])
    refs = [scale.remote(i) for i in range(3)]
    assert_type(orchestra.wait(refs), tuple[list[ObjectRef[float]], list[ObjectRef[float]]])
    assert_type(orchestra.as_completed(refs), Iterator[ObjectRef[float]])
    for ref in orchestra.as_completed(refs, timeout=10, progress=True):
        assert_type(orchestra.get(ref), float)
    assert_type(scale.remote(1).future().result(), float)


    async def awaits() -> None:
        assert_type(await scale.remote(1), float)


    # actors: the class is kept on the handle
    assert_type(RemoteCounter, ActorClass[Counter])
    assert_type(Pinned, ActorClass[Counter])
    assert_type(RemoteCounter.remote(0), ActorHandle[Counter])
    assert_type(RemoteCounter.options(name="c").remote(0), ActorHandle[Counter])
    handle: ActorHandle[Any] = orchestra.get_actor("c")
    orchestra.kill(handle)
''')


def _env() -> dict[str, str]:
    """The orchestra this process imported: from the source tree (MYPYPATH) when it did
    not come from site-packages; else mypy finds the installed package (py.typed)."""
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    home = str(Path(orchestra.__file__).resolve().parents[1])
    if home not in site.getsitepackages():
        env["MYPYPATH"] = home
    return env


def test_a_users_file_type_checks_with_orchestras_hints(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(USER_FILE)
    # orchestra's dependencies publish no hints: as in a user's project, not orchestra's
    # business. Nothing of orchestra's is ignored.
    (tmp_path / "mypy.ini").write_text(
        f"[mypy]\nwarn_unused_ignores = True\nfollow_imports = silent\n"
        f"cache_dir = {tmp_path / 'cache'}\n\n"
        "[mypy-google.*,grpc.*,cloudpickle.*,pyarrow.*,uvloop.*,tqdm.*]\n"
        "ignore_missing_imports = True\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini",
                           "--python-executable", sys.executable, "user.py"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_package_is_marked_typed() -> None:
    assert (Path(orchestra.__file__).parent / "py.typed").is_file()

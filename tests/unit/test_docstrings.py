"""Every public name has a docstring that names each of its parameters, so that
``help(orchestra.init)`` is a reference.

The public names are walked, not listed: everything in ``orchestra.__all__`` (and in
the ``__all__`` of the modules it holds: ``exceptions``, ``actor``, ``util``), every
module of ``orchestra.util`` with its public names, and the public methods and
properties of each public class (ObjectRef's, ActorHandle's, ...). A name added to
any of them later is checked without a change here.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import types
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

import orchestra

pytestmark = pytest.mark.timeout(30)


def _module_names(module: types.ModuleType) -> list[str]:
    """A module's public names: its ``__all__``, else those defined in it."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [n for n, v in vars(module).items() if not n.startswith("_")
            and getattr(v, "__module__", None) == module.__name__
            and not isinstance(v, TypeVar)]   # a module's type variables are not its API


def _walk_module(module: types.ModuleType, prefix: str) -> Iterator[tuple[str, Any]]:
    for name in _module_names(module):
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            if obj.__name__.startswith("orchestra."):
                yield f"{prefix}.{name}", obj
                yield from _walk_module(obj, f"{prefix}.{name}")
            continue
        yield f"{prefix}.{name}", obj
        if inspect.isclass(obj) and obj.__module__.startswith("orchestra"):
            yield from _walk_class(obj, f"{prefix}.{name}")


def _walk_class(cls: type, prefix: str) -> Iterator[tuple[str, Any]]:
    """The public methods and properties a class of orchestra defines itself."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("orchestra"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property) or inspect.isfunction(member):
                yield f"{prefix}.{name}", member


def public_api() -> dict[str, Any]:
    """Qualified name -> object, for every public name of orchestra (first path wins)."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    util_modules = [importlib.import_module(f"orchestra.util.{m.name}")
                    for m in pkgutil.iter_modules(orchestra.util.__path__)
                    if not m.name.startswith("_")]
    walks = [_walk_module(orchestra, "orchestra")]
    walks += [_walk_module(m, m.__name__) for m in util_modules]
    walks += [iter([(m.__name__, m) for m in util_modules])]
    for walk in walks:
        for qualname, obj in walk:
            key = id(obj)
            if key in seen or qualname in found:
                continue
            seen.add(key)
            found[qualname] = obj
    return found


API = public_api()


def _doc(obj: Any) -> str:
    if isinstance(obj, property):
        return inspect.cleandoc(obj.fget.__doc__ or "") if obj.fget else ""
    return inspect.getdoc(obj) or "" if not inspect.isclass(obj) else (obj.__doc__ or "")


def _parameters(obj: Any) -> list[str]:
    """The parameters a caller passes (not self/cls): a class's are its __init__'s."""
    if isinstance(obj, (property, types.ModuleType)):
        return []
    target = obj
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        for klass in obj.__mro__:
            if "__init__" in vars(klass):
                init = vars(klass)["__init__"]
                break
        if init is None or not getattr(init, "__module__", "").startswith("orchestra"):
            return []   # object's or Exception's: nothing of orchestra's to document
        target = init
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    names = [p.name for p in sig.parameters.values()]
    if names and names[0] in ("self", "cls") and (inspect.isclass(obj) or "." in
                                                  getattr(target, "__qualname__", "")):
        names = names[1:]
    return names


def _class_doc(obj: Any) -> str:
    """A class's docstring with its __init__'s (either may name the parameters)."""
    init = obj.__dict__.get("__init__")
    return (obj.__doc__ or "") + "\n" + (getattr(init, "__doc__", None) or "")


def test_the_walk_finds_the_api() -> None:
    # A floor: the walk reaches the names each kind of public thing has.
    for name in ("orchestra.init", "orchestra.get", "orchestra.as_completed",
                 "orchestra.ObjectRef.future", "orchestra.ActorHandle", "orchestra.exceptions"
                 ".TaskError", "orchestra.actor.exit_actor", "orchestra.util.ActorPool.map",
                 "orchestra.util.queue.Queue", "orchestra.RemoteFunction.remote"):
        assert name in API, name


@pytest.mark.parametrize("qualname", sorted(API))
def test_public_name_has_a_docstring(qualname: str) -> None:
    obj = API[qualname]
    doc = _class_doc(obj) if inspect.isclass(obj) else _doc(obj)
    assert doc.strip(), f"{qualname} has no docstring"


@pytest.mark.parametrize("qualname", sorted(q for q in API if _parameters(API[q])))
def test_docstring_names_every_parameter(qualname: str) -> None:
    obj = API[qualname]
    doc = _class_doc(obj) if inspect.isclass(obj) else _doc(obj)
    missing = [p for p in _parameters(obj) if not re.search(rf"\b{re.escape(p)}\b", doc)]
    assert not missing, f"{qualname}'s docstring does not name its parameter(s) {missing}"

"""Package faces that load on first use: ``import pythia_probe.hub`` (and every command's
``--help``) imports no torch; ``pythia_probe.hub.CheckpointSource`` imports its module the
first time it is read.

In a package's ``__init__``::

    __getattr__, __dir__ = faces(__name__, {".steps": ("parse_steps", ...), ...})
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable


def faces(package: str, modules: dict[str, Iterable[str]]
          ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: ``modules`` maps each
    submodule (``.steps``, relative to ``package``) to the public names it defines."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in where:  # a submodule the eager package had imported (pkg.steps.X)
            if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return importlib.import_module(f"{package}.{name}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    sys.modules[package].__class__ = _keeping(set(where))
    return __getattr__, __dir__


def _keeping(names: set[str]) -> type[types.ModuleType]:
    """A package whose face ``X`` stays the name it exports when its submodule ``X`` is
    imported (the import system binds the submodule to the package: icrecall's ``train``)."""

    class Face(types.ModuleType):
        def __setattr__(self, name: str, value: object) -> None:
            if name in names and isinstance(value, types.ModuleType):
                return
            super().__setattr__(name, value)

    return Face


def forwarding(module: str, target: str) -> Callable[[str], object]:
    """The module ``__getattr__`` of a command module kept light (``module``, the command, its
    flags and ``main``): every other name is read from ``target`` (its library, imported on
    first use), so ``module.NAME`` and ``from module import NAME`` work as before."""

    def __getattr__(name: str) -> object:
        if name.startswith("__"):  # import-system and tool probes (__path__, __wrapped__)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(target), name)

    return __getattr__

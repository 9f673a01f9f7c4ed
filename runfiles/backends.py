"""One way to register a backend of any kind: framework adapters,
launchers, schedulers, trace readers.

Each kind is a package folder with one module per backend; a module
registers its backend by name when it is imported (``@KIND.register``).
The folder is listed whenever the backends are listed or a name is not yet
known (its modules are imported once), so a file dropped into the folder is
found with no other change. A name is registered once: a second file
registering it is refused, naming both files (the same file registering
again, when it is reloaded, replaces its own registration).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")


class DuplicateBackend(ValueError):
    """Two files register a backend of one kind under one name."""


class Origin(NamedTuple):
    """Where a backend was registered."""

    file: str  # the file (else the module's name)
    module: str  # the module's name: where its backend's code is


def _registering_module() -> Origin:
    """The module whose code is registering: the first caller outside this
    module."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    module, file = frame.f_globals.get("__name__", "?"), frame.f_globals.get("__file__")
    return Origin(str(Path(file).resolve()) if file else module, module)


class Registry(Mapping[str, T], Generic[T]):
    """Backends of one kind by name, read like a dict.

    ``order``: names that come first, in that order (schedulers are tried
    in detection order); the others follow as registered."""

    def __init__(self, package: str, kind: str, order: Sequence[str] = ()):
        self.package = package
        self.kind = kind
        self.order = tuple(order)
        self._found: dict[str, T] = {}
        self._origin: dict[str, Origin] = {}  # name -> where it was registered

    def register(self, backend: T | None = None, *, name: str | None = None):
        """Register ``backend`` under ``name`` (by default its ``name``
        attribute); as a decorator, ``@KIND.register`` or
        ``@KIND.register(name="x")``. Returns the backend. A name another
        file registered already is refused (DuplicateBackend)."""

        def add(obj: T) -> T:
            key = name or obj.name  # type: ignore[attr-defined]
            origin, first = _registering_module(), self._origin.get(key)
            if first is not None and first.file != origin.file:
                raise DuplicateBackend(
                    f"{self.kind} {key!r} is registered twice: by {first.file} and by {origin.file};"
                    " rename one of them"
                )
            self._found[key], self._origin[key] = obj, origin
            return obj

        return add if backend is None else add(backend)

    def _scan(self) -> None:
        folder = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(folder.__path__):
            importlib.import_module(f"{self.package}.{module.name}")

    def __getitem__(self, name: str) -> T:
        if name not in self._found:
            self._scan()  # a backend added since
        try:
            return self._found[name]
        except KeyError:
            known = ", ".join(self) or "none"
            raise KeyError(f"no {self.kind} named {name!r} (known: {known})") from None

    def __contains__(self, name: object) -> bool:
        if name not in self._found:
            self._scan()
        return name in self._found

    def __iter__(self) -> Iterator[str]:
        self._scan()  # listing the folder is cheap; its modules import once
        first = [n for n in self.order if n in self._found]
        return iter(first + [n for n in self._found if n not in first])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def origin(self, name: str) -> str:
        """The file that registered ``name``."""
        self[name]  # scans the folder where the name is not yet known
        return self._origin[name].file

    def module(self, name: str) -> str:
        """The module that registered ``name`` (where its backend's code is)."""
        self[name]
        return self._origin[name].module

    def forget(self, name: str) -> None:
        """Drop a backend (a test's dummy, once its file is gone)."""
        self._found.pop(name, None)
        self._origin.pop(name, None)

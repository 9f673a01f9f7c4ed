"""One way to register a backend of any kind: framework adapters,
launchers, schedulers, trace readers.

Each kind is a package folder with one module per backend; a module
registers its backend by name when it is imported (``@KIND.register``).
The folder is listed whenever the backends are listed or a name is not yet
known (its modules are imported once), so a file dropped into the folder is
found with no other change.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Backends of one kind by name, read like a dict.

    ``order``: names that come first, in that order (schedulers are tried
    in detection order); the others follow as registered."""

    def __init__(self, package: str, kind: str, order: Sequence[str] = ()):
        self.package = package
        self.kind = kind
        self.order = tuple(order)
        self._found: dict[str, T] = {}

    def register(self, backend: T | None = None, *, name: str | None = None):
        """Register ``backend`` under ``name`` (by default its ``name``
        attribute); as a decorator, ``@KIND.register`` or
        ``@KIND.register(name="x")``. Returns the backend."""

        def add(obj: T) -> T:
            self._found[name or obj.name] = obj  # type: ignore[attr-defined]
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

    def forget(self, name: str) -> None:
        """Drop a backend (a test's dummy, once its file is gone)."""
        self._found.pop(name, None)

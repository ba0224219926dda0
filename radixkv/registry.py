"""A tiny name -> object registry (caches, eviction orders, queue policies, executors)."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from radixkv.argcheck import choice

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj
        return deco

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def remove(self, name: str) -> T:
        """Unregister `name` (a plug-in being unloaded); returns what it named."""
        return self._items.pop(choice(name, self.kind, self._items))

    def get(self, name: str) -> T:
        return self._items[choice(name, self.kind, self._items)]

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

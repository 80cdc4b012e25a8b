"""What the estimator remembers between calls in one process: a bounded, thread-safe LRU type and its
three instances, each defined here once.

Commands that estimate many plans of one model in one process (solve, the language server, the report)
would otherwise probe and simulate the same model again and again. Every key starts with the model's
source (planlang.model.capture.source: the content of its files), so an edited model is probed and
simulated afresh; the least recently used entry goes first when a cache is full.

    MODEL_FACTS   (source, model, plan path, inputs) -> the probed model (ModuleFacts)
    SIMULATIONS   what a simulated step of the local model depends on -> (step, profile, trained, notes)
    PROFILES      what a flop profile of the local model depends on (less than a simulation: not whether
                  microbatches accumulate, not the stages bytes are attributed to) -> its profile, so the
                  solver's candidates that differ only there share one

A caller that keeps its own for the plans of one model (the solver's planlang.solve.facts.ModelFacts,
one per solve) passes a dict; `caller_caches` gives the two it holds there, unbounded: they live as long
as the caller keeps them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:  # types only: this module imports no torch
    from planlang.model.capture.profile import Profile
    from planlang.model.capture.trace import ModuleFacts

V = TypeVar("V")


class LruCache(Generic[V]):
    """A mapping of at most `size` entries (None: unbounded), least recently used out first. `get` and
    `put` are atomic under one lock per cache (the language server estimates on a worker thread)."""

    def __init__(self, name: str, size: int | None) -> None:
        self.name, self.size = name, size
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LruCache({self.name!r}, {len(self)}/{self.size if self.size is not None else 'unbounded'})"

    def get(self, key: Hashable) -> V | None:
        """The value kept for `key` (now the most recently used), or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Hashable, value: V) -> V:
        """Keep `value` for `key`, dropping the least recently used entries beyond the size; returns it."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while self.size is not None and len(self._entries) > self.size:
                self._entries.popitem(last=False)
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Hashable]:
        with self._lock:
            return iter(list(self._entries))

    def values(self) -> list[V]:
        with self._lock:
            return list(self._entries.values())


MODEL_FACTS: LruCache[ModuleFacts] = LruCache("model facts", 8)
SIMULATIONS: LruCache[tuple] = LruCache("simulated steps", 32)
PROFILES: LruCache[Profile] = LruCache("profiles", 32)


def caller_caches(cache: dict | None) -> tuple[LruCache[tuple], LruCache[Profile]]:
    """The simulations and profiles to use: the module's bounded ones, or those kept in the caller's
    `cache` (created there on first use, unbounded)."""
    if cache is None:
        return SIMULATIONS, PROFILES
    return (cache.setdefault("simulated", LruCache("simulated steps (caller's)", None)),
            cache.setdefault("profiled", LruCache("profiles (caller's)", None)))

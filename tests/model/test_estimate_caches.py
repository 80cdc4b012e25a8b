"""planlang.model.price.caches: the estimator's caches are bounded, least recently used out first, each
defined once; a caller's own (the solver's, one per solve) are kept in its dict and unbounded."""
from __future__ import annotations

import threading

from planlang.model.price import caches as C


def test_an_lru_cache_keeps_the_most_recently_used_within_its_size():
    cache: C.LruCache[int] = C.LruCache("test", 2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)  # "b" goes
    assert cache.get("b") is None and list(cache) == ["a", "c"] and len(cache) == 2
    assert cache.put("d", 4) == 4 and list(cache) == ["c", "d"]
    cache.clear()
    assert len(cache) == 0 and cache.values() == []


def test_the_module_caches_are_bounded_and_the_callers_are_not():
    assert all(c.size is not None and c.size > 0 for c in (C.MODEL_FACTS, C.SIMULATIONS, C.PROFILES))
    assert C.caller_caches(None) == (C.SIMULATIONS, C.PROFILES)
    mine: dict = {}
    simulated, profiled = C.caller_caches(mine)
    assert simulated.size is None and profiled.size is None
    assert mine == {"simulated": simulated, "profiled": profiled}
    assert C.caller_caches(mine) == (simulated, profiled)  # the same ones on the next call
    for i in range(100):
        simulated.put(i, (i,))
    assert len(simulated) == 100


def test_puts_from_threads_keep_the_bound():
    cache: C.LruCache[int] = C.LruCache("threads", 8)

    def fill(start: int) -> None:
        for i in range(start, start + 200):
            cache.put(i, i)
            cache.get(i - 1)

    threads = [threading.Thread(target=fill, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 8

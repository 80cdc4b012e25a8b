"""Units of the language: memory, bandwidth, time and compute throughput, each scaled to SI base values.

Memory is in bytes, bandwidth in bytes/second, time in seconds, throughput in FLOP/second. Decimal
prefixes (GB) and binary prefixes (GiB) are both accepted and are different numbers; bits (Gb/s, Gbps)
are converted to bytes.
"""
from __future__ import annotations

from enum import Enum


class Kind(str, Enum):
    MEMORY = "memory"
    BANDWIDTH = "bandwidth"
    TIME = "time"
    THROUGHPUT = "throughput"


def _table() -> dict[str, tuple[Kind, float]]:
    t: dict[str, tuple[Kind, float]] = {"B": (Kind.MEMORY, 1.0), "B/s": (Kind.BANDWIDTH, 1.0)}
    for i, p in enumerate("KMGTP", start=1):
        t[f"{p}B"] = (Kind.MEMORY, 1000.0**i)
        t[f"{p}iB"] = (Kind.MEMORY, 1024.0**i)
        t[f"{p}B/s"] = (Kind.BANDWIDTH, 1000.0**i)
        t[f"{p}iB/s"] = (Kind.BANDWIDTH, 1024.0**i)
        t[f"{p}b/s"] = (Kind.BANDWIDTH, 1000.0**i / 8)
        t[f"{p}bps"] = (Kind.BANDWIDTH, 1000.0**i / 8)
        t[f"{p}FLOPS"] = (Kind.THROUGHPUT, 1000.0**i)
        t[f"{p}FLOP/s"] = (Kind.THROUGHPUT, 1000.0**i)
    t["FLOPS"] = (Kind.THROUGHPUT, 1.0)
    t["FLOP/s"] = (Kind.THROUGHPUT, 1.0)
    t.update({"ns": (Kind.TIME, 1e-9), "us": (Kind.TIME, 1e-6), "ms": (Kind.TIME, 1e-3), "s": (Kind.TIME, 1.0)})
    return t


UNITS: dict[str, tuple[Kind, float]] = _table()


def unit_kind(unit: str) -> Kind | None:
    entry = UNITS.get(unit)
    return entry[0] if entry else None


def to_base(amount: float, unit: str) -> float:
    """`amount` `unit` in base units (bytes, bytes/s, seconds, FLOP/s). KeyError for an unknown unit."""
    return amount * UNITS[unit][1]


def example_units(kind: Kind) -> str:
    return {
        Kind.MEMORY: "GiB, MiB, GB",
        Kind.BANDWIDTH: "GB/s, GiB/s, Gb/s",
        Kind.TIME: "us, ms, ns, s",
        Kind.THROUGHPUT: "TFLOPS, GFLOPS",
    }[kind]


def format_bytes(n: float) -> str:
    """Human-readable binary size: 40 GiB, 1.5 MiB, 512 B."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n:.0f} B"

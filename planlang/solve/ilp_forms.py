"""What the intra-op ILP's reduction (ilp.py) hands its solver backends (ilp_backend.py): the solve
options, the reduced model as linear forms over class variables, and the solver errors. Plain data; a
module of its own so that ilp.py can call the backend and the backend can read these without a cycle."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MERGES = ("exact", "followers", "none")
BACKENDS = ("auto", "highs", "cbc")


@dataclass(frozen=True)
class SolveOptions:
    backend: str = "auto"  # "auto" (HiGHS, then CBC if HiGHS is missing or fails) | "highs" | "cbc"
    time_limit: float | None = None  # seconds per solver call
    gap_rel: float = 1e-6  # relative MIP gap at which the solver may stop
    threads: int | None = None
    merge: str = "followers"  # "exact" | "followers" | "none" (see module docstring)
    alpha: float = 0.1  # weight of communication bytes against redundant bytes ("memory")
    lp_first: bool = True  # solve the LP relaxation first and keep it when integral
    msg: bool = False  # solver log on stdout

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.merge not in MERGES:
            raise ValueError(f"merge {self.merge!r}: choose one of {', '.join(MERGES)}")


class SolveTimeout(RuntimeError):
    """The solver hit its time limit before finding any feasible assignment."""


class SolverFailed(RuntimeError):
    """Every backend failed (not installed, or an error inside the solver)."""


# ------------------------------------------------------------------------------ evaluation
@dataclass
class Form:
    """A linear form over class variables: const + sum lin[c] . x_c + sum <pair[c,d], e_cd>."""

    const: float = 0.0
    lin: dict[int, np.ndarray] = field(default_factory=dict)
    pair: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def _add_lin(self, c: int, vec: np.ndarray) -> None:
        if c in self.lin:
            self.lin[c] = self.lin[c] + vec
        else:
            self.lin[c] = vec.astype(float)

    def add_node(self, c: int, size: int, vec: np.ndarray) -> None:
        if size == 1:
            self.const += float(vec[0])
        else:
            self._add_lin(c, vec)

    def add_edge(self, cu: int, nu: int, cv: int, nv: int, m: np.ndarray) -> None:
        if cu == cv:
            self.add_node(cu, nu, np.diagonal(m).copy())
        elif nu == 1 and nv == 1:
            self.const += float(m[0, 0])
        elif nu == 1:
            self._add_lin(cv, m[0].copy())
        elif nv == 1:
            self._add_lin(cu, m[:, 0].copy())
        else:
            if cu > cv:
                cu, cv, m = cv, cu, m.T
            key = (cu, cv)
            self.pair[key] = self.pair[key] + m if key in self.pair else m.astype(float)

    def fold_separable(self) -> None:
        """An edge matrix a[i] + b[j] needs no edge variables: move it to the two node terms."""
        for key in list(self.pair):
            m = self.pair[key]
            a, b = m[:, 0], m[0, :] - m[0, 0]
            if np.max(np.abs(m - a[:, None] - b[None, :])) <= 1e-12 * max(1.0, float(np.max(np.abs(m)))):
                del self.pair[key]
                self._add_lin(key[0], a.copy())
                self._add_lin(key[1], b.copy())

    def add(self, other: "Form") -> None:
        self.const += other.const
        for c, vec in other.lin.items():
            self._add_lin(c, vec)
        for key, m in other.pair.items():
            self.pair[key] = self.pair[key] + m if key in self.pair else m.astype(float)

    def drop_zeros(self) -> None:
        self.lin = {c: v for c, v in self.lin.items() if np.any(v != 0)}
        self.pair = {k: m for k, m in self.pair.items() if np.any(m != 0)}

    def scale(self) -> float:
        vals = [float(np.max(np.abs(v))) for v in self.lin.values()] + \
               [float(np.max(np.abs(m))) for m in self.pair.values()]
        return max(vals, default=0.0)


@dataclass
class Reduced:
    """The instance after merging: what the backend turns into an LP/MIP."""

    sizes: list[int]  # options per class (classes of size 1 are constants)
    members: dict[str, tuple[int, np.ndarray]]  # node -> (class, node option per class option)
    objectives: dict[str, Form]
    chain: list[Form]  # memory accumulated over steps: chain[i] = chain[i-1] + these terms
    rows: list[tuple[str, Form, int | None]]  # (step, direct terms, chain index or None)
    equal: list[tuple[int, int]] = field(default_factory=list)  # merge="none": groups as constraints
    fixes: list[tuple[int, int]] = field(default_factory=list)  # merge="none": fixed as constraints
    forbid: list[tuple[int, int]] = field(default_factory=list)  # merge="none": options not allowed
    lump: bool = True  # edge variables per group of equal rows / columns of a pair (ilp_backend); not "none"

    def pairs(self) -> list[tuple[int, int]]:
        keys: set[tuple[int, int]] = set()
        for f in [*self.objectives.values(), *self.chain, *(r[1] for r in self.rows)]:
            keys |= set(f.pair)
        return sorted(keys)

    def decode(self, picks: list[int]) -> dict[str, int]:
        return {v: int(m[picks[c]]) for v, (c, m) in self.members.items()}

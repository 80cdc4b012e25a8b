"""The one error of a solver kernel whose choices cannot fit a memory budget: the intra-op ILP's sharding
(planlang.solve.ilp) and rotor's checkpointing schedules (planlang.solve.rotor), each with the least
budget that would fit and what needs it."""
from __future__ import annotations

import math
from fractions import Fraction

from planlang.plan.units import format_bytes


class InfeasibleBudget(ValueError):
    """No choice fits `budget` bytes. `minimum`: the least budget that admits one (None when the caller did
    not ask for it: the ILP's `solve(..., least_when_infeasible=False)`); `cause`: what needs it. For a
    discretised kernel (rotor), `minimum` is on its discretisation (`slot_size` bytes per slot, `min_slots`
    slots: `solve(chain, e.minimum, slot_size=e.slot_size)` succeeds) and `exact` the least peak with
    unrounded sizes; elsewhere `exact` is `minimum`."""

    def __init__(self, budget: float, minimum: float | None, cause: str = "", *, what: str = "sharding",
                 advice: str = "add devices, or allow more sharding (fewer fixed specs)",
                 exact: float | None = None, slot_size: float | None = None, min_slots: int | None = None) -> None:
        self.budget, self.minimum, self.cause, self.what = budget, minimum, cause, what
        self.exact = minimum if exact is None else exact
        self.slot_size, self.min_slots = slot_size, min_slots
        if minimum is None:
            super().__init__(f"no {what} fits the budget of {format_bytes(int(budget))} per device")
            return
        need = bytes_rounded_up(minimum)
        super().__init__(
            f"no {what} fits the budget of {format_bytes(int(budget))} per device; the least memory any choice "
            f"needs is {need} ({cause}). Raise the budget to at least {need}" + (f", {advice}." if advice else "."))

    @classmethod
    def in_slots(cls, budget: float, slots: int, slot_size: Fraction, min_slots: int, exact: float,
                 what: str = "checkpointing schedule") -> "InfeasibleBudget":
        """A discretised kernel's: `min_slots` slots of `slot_size` bytes are the least that fit."""
        least_exact = min_slots * Fraction(slot_size)
        least = float(least_exact)
        if Fraction(least) < least_exact:  # the float just above, so that passing it back gives min_slots slots
            least = math.nextafter(least, math.inf)
        cause = (f"{min_slots} slots of {format_bytes(float(slot_size))}, of {slots} in the budget; "
                 f"{format_bytes(exact)} before rounding to slots")
        return cls(budget, least, cause, what=what, advice="", exact=exact, slot_size=float(slot_size),
                   min_slots=min_slots)


def bytes_rounded_up(n: float) -> str:
    """Like format_bytes, but never below `n` (a budget written with it is enough)."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            v = math.ceil(n / scale * 100 - 1e-9) / 100
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{math.ceil(n - 1e-9):.0f} B"

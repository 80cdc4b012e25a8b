"""The search's bookkeeping for `--time-limit` (anytime): the clock and its deadline, the expected time of
the next candidate, where the search is, and the account of what a cut left unexplored.

A candidate is not started once the limit has passed or would pass while it is priced (the median of
the last ones); the anytime seed is priced whatever the limit, and an intra-op ILP call the limit cuts
keeps its incumbent, priced once past the limit (`overrun`).
"""
from __future__ import annotations

import time


class Cut(BaseException):
    """The search reached --time-limit. The search ends there with the best plan priced so far. A
    BaseException, so the `except Exception` around candidates that may fail does not take it for one."""


REFINED = 4  # meshes stage 2 refines: the stage-1 ranking prices replicated specs, which hides what
#             tensor parallelism gains, so more than the top two go on


class Clock:
    def __init__(self, time_limit: float | None = None, started: float | None = None) -> None:
        self.t0 = time.monotonic() if started is None else started
        self.time_limit = time_limit
        self.deadline = None if time_limit is None else self.t0 + time_limit
        self.seeding = False  # the anytime seed is priced whatever the time limit
        self.overrun = 0  # candidates still priced past the deadline (a cut ILP's incumbent)
        self.durations: list[float] = []  # seconds each priced candidate took (to stop before the limit)

    def pricing_time(self) -> float:
        """What pricing one more candidate is expected to take: the median of the last five priced (the
        first, which builds the model, aside once there are others)."""
        last = sorted(self.durations[1:][-5:] or self.durations[:1])
        return last[len(last) // 2] if last else 0.0

    def check(self, need: float = 0.0) -> None:
        """Raise Cut once --time-limit has passed, or would pass in the `need` seconds the next step is
        expected to take (not while the anytime seed is priced; a cut ILP's incumbent is priced once
        past it)."""
        if self.deadline is None or self.seeding or time.monotonic() + need <= self.deadline:
            return
        if self.overrun > 0:
            self.overrun -= 1
            return
        raise Cut()

    def left(self) -> float:
        """Seconds before the deadline (raises Cut when none are left)."""
        left = self.deadline - time.monotonic()  # type: ignore[operator]
        if left <= 0:
            raise Cut()
        return left


class Where:
    """Where the search is (stage 1's meshes, stage 2's refined meshes and phase), for the account of
    a cut search."""

    def __init__(self) -> None:
        self.state: dict = {"stage": 0}

    def stage1(self, meshes: list[dict]) -> None:
        self.state = {"stage": 1, "meshes": meshes, "done": 0}

    def stage2(self, meshes: list[dict], refined: list[dict]) -> None:
        self.state = {"stage": 2, "meshes": meshes, "refined": refined, "done": 0, "phase": ""}

    def done(self, n: int) -> None:
        self.state["done"] = n

    def at(self, phase: str, within: bool = False) -> None:
        """Where stage 2 is (`within` the current spec set)."""
        if self.state.get("stage") == 2:
            base = self.state["phase"].split(": ")[0] if within else ""
            self.state["phase"] = f"{base}: {phase}" if base else phase

    def account(self, clock: Clock, priced: int) -> str:
        """What the time limit left unexplored: candidates priced, meshes priced and refined, and the
        choices not tried."""
        w = self.state
        meshes = w.get("meshes", [])
        said = [f"search cut by --time-limit {clock.time_limit:g} s (at {time.monotonic() - clock.t0:.1f} s) "
                f"after {priced} candidate plans priced"]
        if w["stage"] <= 1:
            done = w.get("done", 0)
            said.append(f"stage 1 tried {done} of {len(meshes)} meshes" + _not_tried(meshes[done:], "not tried"))
            said.append(f"stage 2 (intra-op ILP specs, microbatches, stage partitions, ZeRO, checkpointing) "
                        f"refined none of up to {min(REFINED, len(meshes))} meshes")
        else:
            refined, done = w["refined"], w["done"]
            said.append(f"stage 1 tried all {len(meshes)} meshes")
            now = f"; cut while refining {mesh_words(refined[done])}" + (f" at {w['phase']}" if w.get("phase") else "")
            said.append(f"stage 2 refined {done} of {len(refined)} meshes"
                        + (now if done < len(refined) else "") + _not_tried(refined[done + 1:], "not refined"))
        return "; ".join(said)


def mesh_words(assign: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in assign.items()) or "the mesh as written"


def _not_tried(assigns: list[dict], what: str, shown: int = 4) -> str:
    if not assigns:
        return ""
    words = " | ".join(mesh_words(a) for a in assigns[:shown])
    more = f" and {len(assigns) - shown} more" if len(assigns) > shown else ""
    return f" ({what}: {words}{more})"

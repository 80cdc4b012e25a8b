"""The search's bookkeeping for `--time-limit` (anytime): the clock and its deadline, the expected time of
the next candidate, where the search is, and the account of what a cut left unexplored.

--time-limit is a hard limit: a candidate is not started once the deadline has passed or would pass while
it is priced (the median of the last ones), and one being priced when it comes is abandoned (`interruptible`,
`expired`). Only the anytime seed is priced whatever the limit (a search must have a plan to write).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator


class Cut(BaseException):
    """The search reached --time-limit. The search ends there with the best plan priced so far. A
    BaseException, so the `except Exception` around candidates that may fail does not take it for one."""


REFINED = 4  # meshes stage 2 refines: the stage-1 ranking prices replicated specs, which hides what
#             tensor parallelism gains, so more than the top two go on


# what the search leaves of --time-limit for writing the plan and the process's exit (the interpreter's
# teardown with torch loaded takes most of a second on a quiet machine, bench/results/solve_time.txt's
# `exit s`): the limit is the whole command's
RESERVE = 0.04  # of the limit
RESERVE_MAX = 2.0  # seconds


class Clock:
    """The search's clock and its deadline. `now` is injectable (tests drive a fake clock, so the
    deadline is asserted without timing anything); with the real clock the deadline is enforced inside
    whatever runs when it comes (`interruptible`: SIGALRM raises Cut there)."""

    def __init__(self, time_limit: float | None = None, started: float | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.t0 = now() if started is None else started
        self.time_limit = time_limit
        reserve = 0.0 if time_limit is None else min(RESERVE * time_limit, RESERVE_MAX)
        self.deadline = None if time_limit is None else self.t0 + time_limit - reserve
        self.seeding = False  # the anytime seed is priced whatever the time limit
        self.seeded: float | None = None  # when the seed was priced (now()), once it was
        self.durations: list[float] = []  # seconds each priced candidate took (to stop before the limit)

    def pricing_time(self) -> float:
        """What pricing one more candidate is expected to take: the median of the last five priced (the
        first, which builds the model, aside once there are others)."""
        last = sorted(self.durations[1:][-5:] or self.durations[:1])
        return last[len(last) // 2] if last else 0.0

    def check(self, need: float = 0.0) -> None:
        """Raise Cut once the deadline has passed, or would pass in the `need` seconds the next step is
        expected to take (not while the anytime seed is priced)."""
        if self.deadline is None or self.seeding or self.now() + need <= self.deadline:
            return
        raise Cut()

    def expired(self) -> None:
        """Raise Cut when the deadline has passed: called inside long loops (rotor's DP, the ILP's budget
        sweep), and by the alarm `interruptible` sets, so that the candidate in progress is abandoned."""
        self.check(0.0)

    def since(self, t: float | None = None) -> float:
        """Seconds from the clock's start (the command's, in the CLI) to `t` (default: now)."""
        return (self.now() if t is None else t) - self.t0

    def left(self) -> float:
        """Seconds before the deadline (raises Cut when none are left)."""
        left = self.deadline - self.now()  # type: ignore[operator]
        if left <= 0:
            raise Cut()
        return left

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Within this block the deadline interrupts whatever runs (a candidate's simulation, its
        estimate, an ILP's set-up): SIGALRM at the deadline raises Cut there, and the candidate in
        progress is abandoned. Only with the real clock, in the main thread, and where the platform
        has SIGALRM; elsewhere the search stops at the checks between and inside candidates."""
        usable = (self.deadline is not None and self.now is time.monotonic and hasattr(signal, "setitimer")
                  and threading.current_thread() is threading.main_thread())
        if not usable:
            yield
            return
        self.expired()

        def ring(signum, frame) -> None:
            if not self.seeding:
                raise Cut()
            signal.setitimer(signal.ITIMER_REAL, 0.05)  # the seed runs on: ring again once it is priced

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.deadline - self.now(), 1e-3))  # type: ignore[operator]
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


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
        said = [f"search cut by --time-limit {clock.time_limit:g} s (at {clock.now() - clock.t0:.1f} s) "
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

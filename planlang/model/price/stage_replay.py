"""A pipeline's simulated step (planlang.model.capture.simulate.simulate_step with stages) for every cut of
one local model into stages, from one recorded run (the solver prices many cuts of a model whose local
shapes, batch, checkpoint groups and precision are the same: 1T, 46 simulations of 22 local models).

What the stages change in a simulated step is only whom each tensor's bytes are counted to (the hooks that
set the owner are on the same modules, the same ops run): the run is made once with each *unit* its own
owner — a module the stages name whole, with its descendants (GPT's `wte`, `h.3`) — and what the live
bytes of each unit did is recorded (`_Recording`: every change of a unit's live bytes, in order, and where
a stage's peak is taken). A cut of the units into stages is then replayed: a stage's live bytes are its
units' sum at every step, its peaks taken where the run took them. Every figure is an integer: the
replayed step equals the step simulated with those stages (tests/model/test_stage_replay.py compares
them field for field), and each recording first replays its own units and must give back the run's.
"""
from __future__ import annotations

import dataclasses
import threading

from planlang.plan.selection import stage_targets

from planlang.model.capture import simulate as _simulate
from planlang.model.capture.simulate import StepMemory
from planlang.model.price.caches import LruCache

# the events of a recording: (unit, its live bytes now), a stage's peak taken at its live bytes (_PEAK,
# unit), every stage's peak set to its live bytes (_RESET: backward begins), the next phase (_PHASE)
_PEAK, _RESET, _PHASE = -1, -2, -3


@dataclasses.dataclass(frozen=True)
class Units:
    """A pipeline's modules (stage_of's keys) as units: `of` module -> unit index, `names` each unit's
    module. Units are numbered in the model's order (`order`), so the first and last are where the run
    starts and computes the loss."""

    of: dict[str, int]
    names: tuple[str, ...]

    def key(self) -> tuple:
        return tuple(sorted(self.of.items()))

    def cut(self, stage_of: dict[str, int]) -> dict[int, int] | None:
        """Unit -> stage of `stage_of` when its stages hold whole units, first and last units in its first
        and last stages (as the run attributes what runs before any stage module and the loss); else None."""
        part = {i: stage_of[n] for i, n in enumerate(self.names)}
        if any(part[self.of[m]] != s for m, s in stage_of.items()):
            return None
        if part[0] != min(stage_of.values()) or part[len(self.names) - 1] != max(stage_of.values()):
            return None
        return part

    def stages(self, stage_of: dict[str, int]) -> dict[int, int]:
        """`cut`, which must cut whole units."""
        part = self.cut(stage_of)
        if part is None:
            raise ValueError("the stages do not cut whole units")
        return part


def units_of(stage_of: dict[str, int], order: list[str]) -> Units | None:
    """Each module of `stage_of` in the unit of its shortest prefix (at a dot) that stage_of names; units
    in the order of `order` (the stage targets, in model order). None when a unit is not in `order`."""
    unit: dict[str, str] = {}
    for m in stage_of:
        parts = m.split(".")
        unit[m] = next(u for u in (".".join(parts[:k]) for k in range(1, len(parts) + 1)) if u in stage_of)
    rank = {n: i for i, n in enumerate(order)}
    names = sorted(set(unit.values()), key=lambda n: rank.get(n, -1))
    if any(n not in rank for n in names):
        return None
    index = {n: i for i, n in enumerate(names)}
    return Units({m: index[u] for m, u in unit.items()}, tuple(names))


_OFF: list[str] = []  # why replaying was turned off in this process (a recording that did not replay its run)


def stage_units(stage_of: dict[str, int], facts) -> Units | None:
    """The pipeline's modules as units (`units_of`, in the model's order: `facts`, the probed model) when
    its stages cut whole units; None otherwise, or when replaying is off."""
    if _OFF:
        return None
    units = units_of(stage_of, stage_targets(facts.all_modules, facts.params))
    return units if units is not None and units.cut(stage_of) is not None else None


RECORDED: LruCache[Recorded] = LruCache("recorded runs", 8)


def recordings(cache: dict | None) -> LruCache[Recorded]:
    """The recorded runs to use: the module's (RECORDED), or those of the caller's `cache` (the solver's,
    one per solve: created there on first use, unbounded), beside caches.caller_caches'."""
    if cache is None:
        return RECORDED
    return cache.setdefault("recorded", LruCache("recorded runs (caller's)", None))


class _Log(dict):
    """A dict of LiveBytes (owner -> bytes) that appends each assignment to `log`."""

    def __init__(self, log: list, mark: int | None, *args) -> None:
        super().__init__(*args)
        self.log, self.mark = log, mark

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.log.append((key, value) if self.mark is None else (self.mark, key))


_LOCAL = threading.local()


class _Recording(_simulate.LiveBytes):
    """LiveBytes that records its owners' live bytes and peaks (owner_live and owner_peak assignments,
    reset_peak, next_phase) into `self.log`."""

    def __init__(self, ignore) -> None:
        self.log: list = []
        super().__init__(ignore)
        self.owner_live = _Log(self.log, None)
        _LOCAL.made = self

    @property
    def owner_peak(self) -> dict:
        return self._owner_peak

    @owner_peak.setter
    def owner_peak(self, value: dict) -> None:
        if hasattr(self, "_owner_peak"):  # reset_peak (not __init__): every owner's peak is its live bytes
            self.log.append((_RESET, None))
        self._owner_peak = _Log(self.log, _PEAK, value)

    def next_phase(self) -> None:
        self.log.append((_PHASE, None))
        super().next_phase()


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One run of a local model with each unit its own stage: its step (by unit) and its events."""

    units: Units
    sim: StepMemory
    log: tuple
    accumulate: bool
    trained: frozenset[str]  # the parameters that got a gradient
    notes: tuple[str, ...]  # building the local model's

    def replay(self, part: dict[int, int]) -> StepMemory:
        """The step as simulate_step gives it with the units cut into stages by `part` (unit -> stage)."""
        unit_live: dict = {}
        live: dict = {}
        peak: dict = {}
        saved: dict | None = None
        peaks: list[dict] = []  # the stages' peaks where each run ends (before the next run's forward)
        phase = 0
        for key, value in self.log:
            if key == _PEAK:
                s = part.get(value, value) if value is not None else None
                peak[s] = max(peak.get(s, 0), live[s])
            elif key == _RESET:
                if saved is None:
                    saved = dict(live)
                peak = dict(live)
            elif key == _PHASE:
                phase += 1
                if phase == 2:  # the accumulated run's forward begins: the first run's peaks are read
                    peaks.append(dict(peak))
            else:
                s = part.get(key, key) if key is not None else None
                live[s] = live.get(s, 0) + value - unit_live.get(key, 0)
                unit_live[key] = value
        peaks.append(dict(peak))

        def by_stage(d: dict) -> dict:
            out: dict = {}
            for u, n in d.items():
                s = part.get(u, u) if u is not None else None
                out[s] = out.get(s, 0) + n
            return out

        if self.accumulate and len(peaks) != 2 or not self.accumulate and len(peaks) != 1:
            raise ValueError("the recorded run has not the phases of a simulated step")
        return dataclasses.replace(self.sim, stage_saved=saved or {}, stage_backward_peak=peaks[0],
                                   stage_backward_peak_accum=peaks[1] if self.accumulate else {},
                                   stage_grads=by_stage(self.sim.stage_grads))


def record(simulate_step, module, inputs: dict, loss, units: Units, accumulate: bool,
           notes: tuple[str, ...]) -> Recorded | None:
    """`simulate_step` (simulate.simulate_step) of `module` with each unit its own stage, recorded; the
    parameters that got a gradient and `notes` kept with it. None when replaying its own units does not
    give back the run's figures (simulate's LiveBytes no longer works as recorded here): replaying is then
    off in this process."""
    _LOCAL.made = None
    sim = simulate_step(module, inputs, loss, dict(units.of), accumulate=accumulate, tracker=_Recording)
    made = getattr(_LOCAL, "made", None)
    if not isinstance(made, _Recording):
        _OFF.append("the simulation did not run a recording LiveBytes")
        return None
    trained = frozenset(n for n, p in module.named_parameters(remove_duplicate=False) if p.grad is not None)
    got = Recorded(units, sim, tuple(made.log), accumulate, trained, notes)
    try:
        same: StepMemory | Exception = got.replay({i: i for i in range(len(units.names))})
    except (KeyError, ValueError) as e:
        same = e
    if same != sim:
        _OFF.append(f"replaying a recording of its own units did not give back its run: {same}")
        return None
    return got

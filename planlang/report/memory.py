"""What the memory chart draws: each device class's peak, stacked by the classes the estimator reports.

The estimator (planlang.model.price.estimate) composes a device's peak as

    parameters + optimizer state + buffers + max(backward phase, optimizer phase)

(`buffers` includes the gradient buckets a bucketed gradient sum keeps the gradients in: a bar draws
them as a segment of their own)
    backward phase  = activations + backward transient (gradients produced so far, temporaries)
    optimizer phase = gradients + the optimizer step's temporaries

and reports the backward transient and the optimizer temporaries summed as `transient`. A bar shows the
phase in which the peak happens, so its segments add up to the estimator's `peak` exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

from planlang.plan.units import format_bytes

# segment names, bottom to top, and the colours the chart gives them
CLASSES = ("parameters", "optimizer state", "gradient buckets", "buffers", "activations", "backward transient", "gradients",
           "optimizer-step temporaries", "step transient")  # the last: a peak measured from the program


@dataclass(frozen=True)
class MemoryBar:
    device: str  # the estimator's device class: "all devices", "stage 0", ...
    segments: tuple[tuple[str, int], ...]  # (class, bytes), bottom to top
    peak: int
    phase: str  # "backward" or "optimizer step": where the peak happens

    def __str__(self) -> str:
        return f"{self.device}: {format_bytes(self.peak)} at the {self.phase} peak"

    @property
    def height(self) -> int:
        return sum(b for _, b in self.segments)

    def segment(self, name: str) -> int:
        return dict(self.segments).get(name, 0)


def memory_bar(row, optimizer_temporaries: int) -> MemoryBar:
    """The bar of one `DeviceEstimate`, given the optimizer temporaries included in its `transient`."""
    backward_transient = row.transient - optimizer_temporaries
    backward = row.activations + backward_transient
    optimizer = row.gradients + optimizer_temporaries
    buckets = getattr(row, "grad_buckets", 0)  # the gradients' own storage, counted in `buffers`: drawn as such
    base = (("parameters", row.parameters), ("optimizer state", row.optimizer), ("gradient buckets", buckets),
            ("buffers", row.buffers - buckets))
    at_backward = (("activations", row.activations), ("backward transient", backward_transient))
    at_step = (("gradients", row.gradients), ("optimizer-step temporaries", optimizer_temporaries))
    # the larger phase holds the peak
    if row.measured_phase:  # the lowered program's measured peak: no modelled phases
        top = (("activations", row.activations), ("step transient", row.transient))
        phase = row.measured_phase
    elif backward >= optimizer:
        top, phase = at_backward, "backward"
    else:
        top, phase = at_step, "optimizer step"
    bar = MemoryBar(row.device, base + top, row.peak, phase)
    if bar.height != row.peak:  # the estimator's composition changed: fail loudly rather than draw wrong bars
        raise ValueError(f"{row.device}: memory classes add up to {bar.height} bytes, the estimated peak is "
                         f"{row.peak}; planlang.report.memory no longer matches planlang.model.price.estimate")
    return bar

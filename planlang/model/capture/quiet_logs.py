"""torch's log of fake-tensor kernels that raised, kept from the user's terminal.

When a kernel raises under FakeTensorMode, torch logs the whole traceback at ERROR level
("failed while attempting to run meta for aten.sub.Tensor") and then raises the error to its caller.
planlang runs models under fake tensors where a failure is an answer, not a fault: `guess_targets` tries
target shapes until the model's loss takes one (an MSE loss refuses the integer labels tried first), and
the estimate falls back from a model's code that does not follow its local shapes, saying so. Each such
try printed ~40 lines of torch's traceback on stderr before a clean result. The filter drops exactly those
records; the exception still reaches whoever called the kernel, which reports it (PL369, the estimate's
notes) or tries the next guess.
"""
from __future__ import annotations

import logging

_LOGGER = "torch._subclasses.fake_tensor"
_MESSAGE = "failed while attempting to run meta"


class _RaisedKernels(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_MESSAGE)


def install() -> None:
    """Drop torch's fake-tensor kernel-failure records (once per process)."""
    log = logging.getLogger(_LOGGER)
    if not any(isinstance(f, _RaisedKernels) for f in log.filters):
        log.addFilter(_RaisedKernels())

"""How a worker process ends after its last collective.

Every rank waits at a barrier, the process groups are destroyed, the standard streams are flushed, and the
process leaves with `os._exit`, skipping the interpreter's finalization. Why: a gloo rank that had finished
all of its work and written its results aborted during teardown (SIGABRT, "terminate called without an
active exception") in one of several fresh-clone CI runs under load; gloo's worker threads outliving
Python's module teardown is the known way to get there (pytorch/pytorch#179291). Nothing useful happens in
finalization once the results are written, so the worker does not go through it."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch.distributed as dist


def leave(code: int = 0) -> NoReturn:
    """Barrier, destroy the process groups, flush, and exit with `code` without finalization."""
    try:
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

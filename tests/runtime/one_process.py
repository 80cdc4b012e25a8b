"""A gloo process group of one rank in the test process, for tests that run the runtime's collectives
without spawning workers."""
from __future__ import annotations

import contextlib
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist


@contextlib.contextmanager
def one_process_group():
    """The default process group, one gloo rank on a free local port, destroyed on exit; skips the test
    when a group already exists in this process."""
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()

"""A pipeline stage that holds receive buffers for the microbatches in flight only.

torch.distributed.pipelining's `PipelineStage` makes, when a schedule first runs, a receive buffer for
every microbatch: the activation from the previous stage and the gradient from the next one, kept for the
life of the stage. Their bytes grow with the microbatch count, not with the pipeline depth: Megatron-LM's
1T row (Narayanan et al. 2021, Table 1: 512 microbatches of 2048 x 25600 bf16 per stage) would hold 100 GiB
of them on every middle stage, more than the device. Megatron-LM's own schedule receives into a fresh
tensor per microbatch and lets it go once that microbatch's backward has run, so a stage holds the
activations of its microbatches in flight (at most p - s under 1F1B) and one or two gradients.

`InFlightStage` does the same with torch's schedules: a microbatch's receive buffers are allocated when
its receive is posted (`get_fwd_recv_ops` / `get_bwd_recv_ops`) and dropped once its backward has run
(`backward_one_chunk`, or `backward_weight_one_chunk` when a zero-bubble schedule splits it). The values
the schedule computes are unchanged (tests/runtime/test_recv_buffers_gloo.py against torch's stage);
planlang.model.price.estimate counts the buffers the same way.
"""
from __future__ import annotations

import copy

import torch
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import _make_tensor_from_meta


class InFlightStage(PipelineStage):
    """`PipelineStage` whose receive buffers live from a microbatch's receive to its backward. On the last
    stage, `kept` (a list; None: off) collects each microbatch's output, detached, for `pm(...)` to return
    (torch's own `output_chunks` would be merged by its schedule, which cannot cat a scalar)."""

    kept: list | None = None
    # the rank's gradient sums (planlang.runtime.grad_sync.GradSync), on the rank's stage that runs its
    # last backward: held in `no_sync` through the schedule, they start bucket by bucket during that
    # stage's last microbatch's backward (DDP's overlap under torch's schedules, which pass `last_backward`)
    grad_sync = None
    # the same sums on every stage of the rank: a split backward's W puts its gradients in their buckets
    grad_buckets = None

    def forward_one_chunk(self, fwd_chunk_id: int, args, kwargs=None, save_forward_output: bool = True):
        out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output=save_forward_output)
        if self.kept is not None and self.is_last:
            self.kept.append(_detached(out))
        return out

    def _setup_forward_recv_info(self, num_microbatches: int, has_backward: bool) -> None:
        # torch's setup for one microbatch (one buffer per input), copied to every microbatch unallocated:
        # the buffers of all microbatches never exist at once, not even at setup
        super()._setup_forward_recv_info(1, has_backward)
        first = self.args_recv_info[0]
        for chunk in range(num_microbatches):
            self.args_recv_info[chunk] = tuple(_unallocated(info, self.device) for info in first)

    def _create_grad_recv_info(self, act_send_info: dict) -> tuple:
        return tuple(_unallocated(info, self.device) for info in super()._create_grad_recv_info(act_send_info))

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list:
        self._allocate(self.args_recv_info[fwd_chunk_id])
        return super().get_fwd_recv_ops(fwd_chunk_id)

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list:
        if self.has_backward and not self.is_last:
            self._allocate(self.grad_recv_info[bwd_chunk_id])
        return super().get_bwd_recv_ops(bwd_chunk_id)

    def backward_one_chunk(self, bwd_chunk_id: int, loss=None, full_backward: bool = True,
                           last_backward: bool = False):
        if self.grad_sync is not None:
            self.grad_sync.no_sync = not last_backward
            if last_backward:  # the rank's other stages are done: their buckets start now
                self.grad_sync.launch_complete({id(p) for p in self.submod.parameters()})
        out = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                         last_backward=last_backward)
        if full_backward:
            self._release(bwd_chunk_id)
        return out

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False):
        # a split backward (zero_bubble, zbv, dualpipev): the weight gradients come here, after the input gradient. torch
        # assigns them to `.grad` itself except on the model's first stage (no post-accumulate-grad hook
        # fires then): they go into their buckets' slices first (`GradSync.adopt`), and those buckets start
        # once this, the rank's last backward, is done; the model's first stage's start during it
        mine = {id(p) for p in self.submod.parameters()}
        if self.grad_buckets is not None:
            self.grad_buckets.adopt(self._weighted(bwd_chunk_id))
        if self.grad_sync is not None:
            self.grad_sync.no_sync = not last_backward
            if last_backward:
                self.grad_sync.launch_complete(mine)
        out = super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        if self.grad_sync is not None and last_backward:
            self.grad_sync.launch_complete(set())  # every gradient of the rank is complete now
        self._release(bwd_chunk_id)
        return out

    def _weighted(self, chunk: int) -> set[int]:
        """The parameters (ids) whose weight gradients torch's W of microbatch `chunk` computes: those of
        its weight groups (`stage_backward_input`'s `param_groups`; none on the model's first stage, whose
        W is a whole backward). A parameter the loss does not reach keeps no gradient (None), as under the
        other schedules."""
        state = getattr(self, "backward_state", {}).get(chunk)
        groups = state[1] if state is not None else None
        if not groups:
            return set()
        reached = set().union(*(g["params"] for g in groups))
        return {id(p) for p in self.submod.parameters() if p.requires_grad and _grad_node(p) in reached}

    def _allocate(self, infos) -> None:
        for info in infos:
            if getattr(info, "_unallocated", False):
                info.buffer = _make_tensor_from_meta(info.tensor_meta, self.device)
                info._unallocated = False

    def _release(self, chunk: int) -> None:
        """Drop the stage's references to microbatch `chunk`'s receive buffers (what autograd or a pending
        send still holds stays alive until they let go)."""
        for info in (*self.args_recv_info.get(chunk, ()), *self.grad_recv_info.get(chunk, ())):
            if not info.is_root_arg and info.buffer is not None and info.tensor_meta is not None:
                info.buffer = _empty(self.device)
                info._unallocated = True


def _grad_node(p):
    """The autograd node a parameter's gradient accumulates in (what torch's weight groups hold)."""
    return p.view_as(p).grad_fn.next_functions[0][0]


def _detached(out):
    """A stage's output (a tensor or a tuple of them) with every tensor detached from autograd."""
    if isinstance(out, tuple):
        return tuple(_detached(o) for o in out)
    return out.detach() if isinstance(out, torch.Tensor) else out


def _unallocated(info, device: torch.device):
    """A copy of torch's receive descriptor `info` without its buffer (allocated when a receive is posted)."""
    if info.is_root_arg or info.buffer is None or info.tensor_meta is None:
        return info
    lazy = copy.copy(info)
    lazy.buffer = _empty(device)
    lazy._unallocated = True
    return lazy


def _empty(device: torch.device) -> torch.Tensor:
    return torch.empty(0, device=device)

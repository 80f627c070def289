"""Chapter 11: training on several processes with PyTorch's own engine (data parallelism).

``torchrun --nproc_per_node=N -m course_attn.train ...`` starts N processes and tells
each its place through environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``): :func:`world_from_env` reads them, and :func:`join` joins the
process group (NCCL on CUDA, gloo on a CPU). Every process holds the whole model
(``DistributedDataParallel``), draws the same global batch from the same seeded
stream and trains on its own slice of it; after the backward pass, DDP averages
the gradients over the processes, so every copy takes the same optimizer step.

How far "the same run" holds depends on dropout. With ``dropout=0``, a run on one
process with gradient accumulation, or with the whole global batch, takes the same
steps, to float rounding (``tests/test_distributed.py`` proves it on a CPU). With
dropout on, each process draws its dropout masks from its own stream (seeded
``seed + rank``), and one process draws the masks of all its micro-batches from one
stream: the rows and the batches are the same, the masks are not. The steps then
come from the same distribution but are other steps, and the losses differ by the
noise of dropout (the same test pins this too). Equal steps would need each row's
mask to depend on the row alone, which the trainer does not do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["World", "all_sum", "any_rank", "join", "launcher", "leave", "micro_batch_rows",
           "world_from_env"]


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` processes: ``rank`` in all, ``local_rank`` here,
    among the ``local_size`` processes of this machine (``size`` on one machine)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int | None = None  # None: every process on this machine

    @property
    def nodes(self) -> int:
        """How many machines the processes run on."""
        return 1 if self.local_size is None else max(1, self.size // self.local_size)

    @property
    def main(self) -> bool:
        """Rank 0 prints, writes checkpoints and metrics, and samples; the others train."""
        return self.rank == 0


def micro_batch_rows(world: World, k: int, batch_size: int) -> slice:
    """The rows of the global batch that process ``world.rank`` trains on in micro-batch ``k``.

    Micro-batch ``k`` of process ``r`` among ``N`` is rows ``[(k N + r) B, (k N + r + 1) B)``
    of the global batch, so the processes never share a row, and together, over the
    ``grad_accum`` micro-batches, they cover it once: what one process with the whole
    global batch would train on.
    """
    first = (k * world.size + world.rank) * batch_size
    return slice(first, first + batch_size)


def world_from_env() -> World:
    """This process's :class:`World` from torchrun's variables (one process without them)."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    values = {name: os.environ.get(name) for name in names}
    if values["WORLD_SIZE"] is None:
        return World()
    try:
        rank, size, local = (int(values[name] or "0") for name in names[:3])
        local_size = int(values["LOCAL_WORLD_SIZE"] or size)
    except ValueError:
        raise ValueError(f"RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers "
                         f"(torchrun sets them), got {values}") from None
    if size < 1 or not 0 <= rank < size or local < 0 or not 1 <= local_size <= size:
        raise ValueError(f"RANK={rank} must lie in [0, WORLD_SIZE={size}), LOCAL_RANK="
                         f"{local} must be >= 0 and LOCAL_WORLD_SIZE={local_size} in [1, "
                         f"{size}]")
    return World(rank, size, local, local_size)


def launcher(world: World) -> list[str]:
    """The words that start a module (``-m ...`` follows) on as many processes again:
    ``python`` for one, ``torchrun --nproc_per_node=N`` (and ``--nnodes``) for several."""
    if world.size == 1:
        return ["python"]
    per_node = world.size if world.local_size is None else world.local_size
    nodes = [f"--nnodes={world.nodes}"] if world.nodes > 1 else []
    return ["torchrun", *nodes, f"--nproc_per_node={per_node}"]


def join(world: World, device: torch.device) -> torch.device:
    """Join the process group (NCCL on CUDA, gloo elsewhere); return this process's device.

    On CUDA each process takes the GPU of its ``local_rank`` unless ``device`` names one.
    A single process joins nothing.
    """
    if world.size == 1:
        return device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", world.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                rank=world.rank, world_size=world.size)
    return device


def leave(world: World) -> None:
    """Leave the process group (at the end of a run, or when it stops)."""
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def all_sum(value: Tensor, world: World) -> Tensor:
    """The sum of ``value`` over the processes, element by element (every process gets it);
    itself on one. The trainer sums its pending losses and stop flag in one call."""
    if world.size == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def any_rank(flag: bool, world: World, device: torch.device) -> bool:
    """Whether ``flag`` is true on any process (all of them learn the answer)."""
    if world.size == 1:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())

"""Ranks and collectives: everything distributed runs go through, in one place.

Under torchrun every rank runs the same code; in one process every function here is a no-op or
the identity. FSDP makes every forward and backward a collective, so ranks must run the same
number of micro-batches (`lockstep_chunks` pads a rank with zero-weight dummies) and losses are
global sums (`backward` undoes FSDP's mean over ranks). With trainer.strategy replicate there is no FSDP:
every rank holds the whole model, `average_grads` reduces the trainable gradients once per step, and no
forward is a collective, so a rank with fewer rows runs fewer micro-batches (no dummies).
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def print0(*a, **k):
    """print on rank 0 only (flushed)."""
    if rank() == 0:
        print(*a, **k, flush=True)


def backend_for(device: torch.device) -> str:
    """The process group's backends for a rank on `device`. Our collectives reduce CPU tensors (metric
    sums, gathered objects) while FSDP reduces CUDA ones, and NCCL has no CPU all_reduce ("No backend
    type associated with device type cpu"): on CUDA the group carries gloo for CPU and nccl for CUDA."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


TIMEOUT = timedelta(minutes=60)
"""how long a rank waits for the others at a collective: ranks whose rollouts end at different times
wait at the next all_sum, and NCCL's default (10 minutes) is shorter than one slow step"""


def launched() -> bool:
    """torchrun (or another launcher that sets RANK and WORLD_SIZE) started this process. Then the run is
    distributed even on one rank: `torchrun --nproc_per_node 1` runs the process group and FSDP2 that
    8 GPUs run (the way to check a multi-GPU setup on one GPU); plain `python train.py` runs without."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init() -> torch.device:
    """This rank's device, and the process group when torchrun started us (backend_for the device,
    bound to it with device_id after cuda.set_device, so NCCL never guesses GPU 0)."""
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if launched() and not dist.is_initialized():
        dist.init_process_group(backend_for(device), timeout=TIMEOUT,
                                device_id=device if device.type == "cuda" else None)
    return device


def all_sum(x: float | list) -> float | list:
    if world() == 1:
        return x
    t = torch.tensor(x, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj) -> list:
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def barrier():
    if world() > 1:
        dist.barrier()


def lockstep_chunks(rows: list, size: int, dummy=0, weights: list | None = None, lengths: list | None = None,
                    max_tokens: int | None = None) -> list[tuple[list, float]]:
    """Micro-batches of `rows` as (rows, weight); every rank gets as many as the busiest rank, the
    extra ones are ([dummy], weight 0); not after shard(model, "replicate"), where no forward is a
    collective and a dummy would be a forward and backward for nothing. weights: each row counts that
    much towards `size` (a packed row counts its turns). max_tokens with lengths (each row's tokens): a chunk also holds at most that many
    padded tokens, its rows x its longest row. A chunk holds at least one row."""
    chunks, cur, used, width = [], [], 0, 0
    for i, r in enumerate(rows):
        w, n = (1 if weights is None else weights[i]), (0 if lengths is None else lengths[i])
        if cur and (used + w > size or (max_tokens is not None and (len(cur) + 1) * max(width, n) > max_tokens)):
            chunks.append((cur, 1.0))
            cur, used, width = [], 0, 0
        cur.append(r)
        used, width = used + w, max(width, n)
    chunks += [(cur, 1.0)] if cur else []
    if not _lockstep:  # shard() under trainer.strategy replicate: no forward is a collective
        return chunks
    n = int(max(gather_objects(len(chunks))))
    return chunks + [([dummy], 0.0)] * (n - len(chunks))


_lockstep = True  # whether lockstep_chunks pads ranks to one count; shard() clears it for a replicated model


def backward(loss):
    (loss * world()).backward()  # FSDP averages gradients over ranks; our losses are global sums


def clip_grad(params, max_norm) -> float:
    """Clip the gradients of `params` to a total 2-norm of max_norm; returns the norm before clipping. FSDP's
    sharded parameters and whole ones (the critic: its adapter sharded, its linear head not) are normed group
    by group and clipped by the norm of both: clip_grad_norm_ refuses a list that mixes DTensors and tensors."""
    groups = [g for g in ([p for p in params if hasattr(p, "full_tensor")],
                          [p for p in params if not hasattr(p, "full_tensor")]) if g]
    norms = [torch.nn.utils.get_total_norm([p.grad for p in g if p.grad is not None]) for g in groups]
    total = torch.linalg.vector_norm(torch.stack([(n.full_tensor() if hasattr(n, "full_tensor") else n).float()
                                                  for n in norms]))
    for g in groups:
        torch.nn.utils.clip_grads_with_norm_(g, max_norm, total)
    return float(total)


def shard(model, strategy: str = "fsdp2"):
    """Under torchrun, how the model is spread over the ranks (trainer.strategy). fsdp2: each decoder layer,
    then the root, is sharded (every forward and backward gathers the layer's weights). replicate: every rank
    keeps the whole model; the frozen base is never gathered or reduced, and only the trainable gradients are
    averaged, once per optimizer step (average_grads), and ranks run only their own micro-batches
    (lockstep_chunks pads none)."""
    global _lockstep
    if not dist.is_initialized():
        return
    _lockstep = strategy == "fsdp2"
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:  # the replicas start equal whatever each rank drew or read: every trainable tensor is rank 0's
        for p in model.parameters():  # (the frozen base is read from the same files by every rank)
            if p.requires_grad:
                dist.broadcast(p.data, src=0)


def sharded(model) -> bool:
    """Whether FSDP2 shards the model's parameters (trainer.strategy fsdp2 under torchrun), not whole on this rank."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def average_grads(params: list):
    """Average over the ranks the gradients no FSDP reduced: the plain (not DTensor) parameters, i.e. a
    replicated model's adapters and the critic's head, as one flat all_reduce. Ranks may disagree on which
    parameters have a gradient (a rank whose micro-batches held no row of an adapter), so that is agreed
    first: a gradient any rank has is averaged with zeros for the ranks without; none anywhere stays None, as
    in one process (AdamW then leaves the parameter alone). Then each rank holds the gradient of the global
    loss, as FSDP's reduce-scatter leaves it (the losses are global sums and `backward` multiplies by world)."""
    plain = [p for p in params if not hasattr(p, "full_tensor")]
    if world() == 1 or not plain:
        return
    has = torch.tensor([float(p.grad is not None) for p in plain], dtype=torch.float64)
    dist.all_reduce(has)
    used = [p for p, h in zip(plain, has.tolist()) if h > 0]
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not used:
        return
    flat = torch.cat([p.grad.reshape(-1).float() for p in used])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    for p, g in zip(used, flat.split([p.numel() for p in used])):
        p.grad.copy_(g.view_as(p.grad))


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor onto the device without making the host wait. From pageable memory `.to("cuda")` is a
    copy followed by a stream synchronise: the host waits for every kernel queued before it (the previous
    micro-batch's backward), once per tensor per micro-batch. From pinned memory the copy is queued like a
    kernel and the caching host allocator keeps the pinned block until it has run."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)

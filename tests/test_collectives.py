"""The process group: the backends a rank gets for its device, and our CPU collectives on a
device-mapped group of two real ranks (the shape a CUDA run's `cpu:gloo,cuda:nccl` group has)."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import collectives


def _map(backend: str) -> dict:
    from torch.distributed.distributed_c10d import Backend, BackendConfig
    return BackendConfig(Backend(backend)).get_device_backend_map()


def test_a_cuda_rank_gets_a_cpu_backend_for_our_cpu_collectives():
    cuda = _map(collectives.backend_for(torch.device("cuda", 1)))
    assert cuda == {"cpu": "gloo", "cuda": "nccl"}
    assert "cpu" not in _map("nccl")  # what init_process_group("nccl") registers: no CPU all_reduce
    assert _map(collectives.backend_for(torch.device("cpu")))["cpu"] == "gloo"


def _worker(r, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("cpu:gloo", rank=r, world_size=2, timeout=collectives.TIMEOUT)
    try:
        s = collectives.all_sum([1.0 + r, 10.0 * r])
        g = collectives.gather_objects({"rank": r})
        chunks = collectives.lockstep_chunks(list(range(3 if r == 0 else 1)), 1, dummy=-1)
        out.put((r, s, g, chunks))
    finally:
        dist.destroy_process_group()


def test_cpu_collectives_on_a_device_mapped_group_of_two_ranks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(r, port, q)) for r in range(2)]
    for p in ps:
        p.start()
    got = dict((x[0], x[1:]) for x in (q.get(timeout=120) for _ in ps))
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    for r in (0, 1):
        s, g, chunks = got[r]
        assert s == [3.0, 10.0] and g == [{"rank": 0}, {"rank": 1}]
        assert len(chunks) == 3  # the busier rank's count; rank 1 pads with zero-weight dummies
    assert got[1][2] == [([0], 1.0), ([-1], 0.0), ([-1], 0.0)]


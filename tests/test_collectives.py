"""The process group: the backends a rank gets for its device, and our CPU collectives on a
device-mapped group of two real ranks (the shape a CUDA run's `cpu:gloo,cuda:nccl` group has)."""
import torch

import collectives
from helpers import on_two_ranks


def _map(backend: str) -> dict:
    from torch.distributed.distributed_c10d import Backend, BackendConfig
    return BackendConfig(Backend(backend)).get_device_backend_map()


def test_a_cuda_rank_gets_a_cpu_backend_for_our_cpu_collectives():
    cuda = _map(collectives.backend_for(torch.device("cuda", 1)))
    assert cuda == {"cpu": "gloo", "cuda": "nccl"}
    assert "cpu" not in _map("nccl")  # what init_process_group("nccl") registers: no CPU all_reduce
    assert _map(collectives.backend_for(torch.device("cpu")))["cpu"] == "gloo"


def _collectives(r):
    return (collectives.all_sum([1.0 + r, 10.0 * r]), collectives.gather_objects({"rank": r}),
            collectives.lockstep_chunks(list(range(3 if r == 0 else 1)), 1, dummy=-1))


def test_cpu_collectives_on_a_device_mapped_group_of_two_ranks():
    got = on_two_ranks(_collectives, backend="cpu:gloo")
    for r in (0, 1):
        s, g, chunks = got[r]
        assert s == [3.0, 10.0] and g == [{"rank": 0}, {"rank": 1}]
        assert len(chunks) == 3  # the busier rank's count; rank 1 pads with zero-weight dummies
    assert got[1][2] == [([0], 1.0), ([-1], 0.0), ([-1], 0.0)]


def _average(r):
    ps = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    ps[0].grad = torch.tensor([1.0, 2.0]) if r == 0 else torch.tensor([3.0, 4.0])
    ps[1].grad = torch.tensor([4.0, -2.0]) if r == 0 else None  # rank 1 had no row of this adapter
    collectives.average_grads(ps)  # ps[2]: no gradient on either rank
    return [None if p.grad is None else p.grad.tolist() for p in ps]


def test_replicated_gradients_are_averaged_and_a_missing_one_counts_as_zero():
    got = on_two_ranks(_average)
    assert got[0] == got[1] == [[2.0, 3.0], [2.0, -1.0], None]


def _spread(r, strategy):
    class Net(torch.nn.Module):  # the shape collectives.shard walks: model.model.layers
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
    torch.manual_seed(r)  # each rank draws other weights
    net = Net()
    net.model.layers[1].requires_grad_(False)  # frozen: every rank's own (in troupe: read from the same files)
    collectives.shard(net, strategy)
    chunks = collectives.lockstep_chunks(list(range(3 if r == 0 else 1)), 1, dummy=-1)  # rank 1 has fewer rows
    if strategy == "fsdp2":
        return sorted({type(p).__name__ for p in net.parameters()}), chunks
    return (sorted({type(p).__name__ for p in net.parameters()}), float(net.model.layers[0].weight.sum()),
            float(net.model.layers[1].weight.sum()), chunks)


def _fsdp2(r):
    return _spread(r, "fsdp2")


def _replicate(r):
    return _spread(r, "replicate")


def test_replicate_leaves_every_rank_the_whole_model_where_fsdp2_shards_it():
    """...and so only FSDP2's ranks run in lockstep: under replicate no forward is a collective, and a rank with
    fewer rows runs only its own micro-batches, no zero-weight dummies."""
    fsdp = on_two_ranks(_fsdp2)
    assert fsdp[0][0] == ["DTensor"]
    assert fsdp[1][1] == [([0], 1.0), ([-1], 0.0), ([-1], 0.0)]  # padded to rank 0's three
    got = on_two_ranks(_replicate)
    assert got[0][0] == got[1][0] == ["Parameter"]
    assert got[0][1] == got[1][1]  # the trainable weights are rank 0's on both
    assert got[0][2] != got[1][2]  # nothing frozen was sent
    assert got[0][3] == [([0], 1.0), ([1], 1.0), ([2], 1.0)] and got[1][3] == [([0], 1.0)]


def _clip_mixed(r):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)  # every rank the same model and gradients
    body, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    grads = [torch.randn_like(p) * 3 for p in [*body.parameters(), *head.parameters()]]
    ref = [g.clone() for g in grads]
    want = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in ref])))
    scale = min(1.0, 1.0 / (want + 1e-6))
    fully_shard(body)  # the critic's shape: a sharded adapter beside a whole linear head
    for p, g in zip([*body.parameters(), *head.parameters()], grads):
        if hasattr(p, "full_tensor"):
            from torch.distributed.tensor import distribute_tensor
            g = distribute_tensor(g, p.device_mesh, p.placements)
        p.grad = g
    got = collectives.clip_grad([*body.parameters(), *head.parameters()], 1.0)
    after = [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for p in [*body.parameters(), *head.parameters()]]
    return got, want, max(float((a - g * scale).abs().max()) for a, g in zip(after, ref))


def test_clipping_a_sharded_adapter_beside_a_whole_head_norms_them_together():
    """GAE's critic under FSDP2: its adapter's parameters are DTensors, its head plain tensors, and
    clip_grad_norm_ refused the mix (every torchrun GAE run failed at the critic's first step)."""
    for got, want, err in on_two_ranks(_clip_mixed).values():
        assert abs(got - want) < 1e-4 * want and want > 1.0  # the norm of everything, before clipping
        assert err < 1e-5  # every gradient scaled by 1 / norm


def _static_after_full_weight_update(r):
    import model as model_mod
    from rollout import Request, SamplingParams, TorchEngine
    m, tok = model_mod.load_model("tiny", seed=0)
    collectives.shard(m.eval(), "fsdp2")  # every weight trainable: full-weight training, sharded
    static, eager = TorchEngine(m, tok, compile=True, _capture=False), TorchEngine(m, tok)
    reqs = [Request(tok.encode(t), None, SamplingParams(max_new_tokens=6, greedy=True, stop_token_ids=[]))
            for t in ("What is 3 + 4?", "the answer is")]
    before = [x.completion_ids for x in static.generate(reqs)]
    (_, b, *_, seen), = static._graphs.values()
    weights, kv = seen[0], b.kv
    with torch.no_grad():  # an optimizer step's in-place change of the sharded q/k/v weights
        for p in m.model.layers[0].self_attn.parameters():
            p.mul_(-3.0)
    after = [x.completion_ids for x in static.generate(reqs)]
    # the gather's new storage is read by graphs captured again, into the shape's buffers: one KV cache, not two
    shapes = list(static._graphs.values())
    return before, after, [x.completion_ids for x in eager.generate(reqs)], (
        shapes[-1][-1][0] != weights, len(shapes), shapes[-1][1].kv is kv)


def test_the_static_step_sees_a_full_weight_update_under_fsdp2():
    """Under FSDP2 the engine gathers the weights for each call, and the gather keeps each parameter's version
    counter: the static step's concatenated q/k/v weights are copied afresh every call, so an in-place update of
    the sharded weights reaches it (the same tokens as the eager path's after the update, other than before).
    Where the gather hands back new storage, the step is captured again into the same shape's buffers (before,
    each call's new parameter addresses made a new shape with its own KV cache: two held at once)."""
    got = on_two_ranks(_static_after_full_weight_update)
    for r in (0, 1):
        before, static, eager, (moved, shapes, same_kv) = got[r]
        assert static == eager and static != before
        assert moved and shapes == 1 and same_kv  # new storage (on CPU's gloo every call), the shape's buffers kept


def _captures_a_call_under_fsdp2(r):
    import model as model_mod
    from rollout import Request, SamplingParams, TorchEngine
    m, tok = model_mod.load_model("tiny", seed=0)
    collectives.shard(m.eval(), "fsdp2")
    static = TorchEngine(m, tok, compile=True, _capture=False, max_batch_size=1)  # two batches a call, one shape
    captures, capture = [], static._capture_window
    static._capture_window = lambda *a, **k: captures.append(a[4]) or capture(*a, **k)
    reqs = [Request(tok.encode(t), None, SamplingParams(max_new_tokens=150, greedy=True, stop_token_ids=[]))
            for t in ("What is 3 + 4?", "What is 5 + 1?")]
    per_call, outs = [], []
    for _ in range(3):
        n = len(captures)
        outs.append([x.completion_ids for x in static.generate(reqs)])
        per_call.append(captures[n:])
    return per_call, outs, next(iter(static._graphs))[1]  # the shape's cache length


def test_weights_that_move_every_call_are_captured_once_a_call_not_once_a_window():
    """Where FSDP2's gather hands back new storage at every call (CPU's gloo does), every graph is captured again at
    every call. Once a call has found the weights moved since an earlier one, the step attends to the whole cache,
    so a call captures once, where windows would capture at each (each capture: warm-up steps, a device sync, the
    allocator's cached blocks emptied); its second batch replays that graph. The first call, with nothing to
    compare, takes the windows. Greedy: the same tokens each call."""
    for per_call, outs, L in on_two_ranks(_captures_a_call_under_fsdp2).values():
        assert len(per_call[0]) >= 3 and per_call[0][-1] == L, per_call  # the windows: 64, 128, ... L
        assert per_call[1] == per_call[2] == [L], per_call  # not [L, 64, 128]: the second batch takes no window
        assert outs[0] == outs[1] == outs[2] and [len(x) for x in outs[0]] == [150, 150]

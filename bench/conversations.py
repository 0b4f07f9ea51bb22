"""Agents acting together, counted in one run: engine calls per rollout with independent turns handed out at
once vs one by one, and how many continued turns extend the earlier one token for token with the spliced ids
vs re-encoded text.

    python bench/conversations.py                         # both measures, defaults below
    python bench/conversations.py --calls-only            # the engine-call counts (tiny model, seconds)

engine calls: one rollout of a config's first --tasks train tasks x its chains (the config's model unless
--model; sampled, seeded), `parallel` on and off (data.env_kwargs.parallel), the same seeds: the number of
engine.generate calls, the rollout's wall time and whether the two played the same turns (they must: the
order of independent turns cannot matter). Configs: configs/tiny_video_qa.py and configs/tiny_debate.py at
--model tiny; give --model smollm2-135m-instruct for wall times on the real model.

extension: SmolLM2-135M-Instruct samples the math team judge's first verdict on --episodes wrong solutions in
the per-role layout (temperature 1, --reply-tokens), then its conversation goes on with a refined solution to judge
(agents.math_team.role_messages); for each second turn, whether its prompt ids start with the first turn's
prompt + completion ids, built the two ways: the driver's (chat.continue_ids: the sampled ids spliced) and the
old one (the messages re-encoded whole, chat.chat_ids: the reply's text encoded again).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT)] + [x for x in sys.path if os.path.abspath(x or ".") != str(ROOT / "bench")]

import chat  # noqa: E402
from config import load_config_file  # noqa: E402
from model import load_model  # noqa: E402
from rollout import Request, RoleSpec, SamplingParams, TorchEngine, run_episodes  # noqa: E402
from workflows import load_data, workflow  # noqa: E402


class Counting:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def generate(self, reqs):
        self.calls += 1
        return self.inner.generate(reqs)


def engine_calls(config: str, spec: str | None, n_tasks: int, threads: int) -> None:
    import torch
    torch.set_num_threads(threads)
    cfg = load_config_file(str(ROOT / config))
    m, tok = load_model(spec or cfg.model.spec)
    tasks = load_data(cfg)[0][:n_tasks]
    roles = {r.name: RoleSpec(None, SamplingParams(max_new_tokens=r.max_tokens, temperature=r.temperature, seed=7))
             for r in cfg.roles}
    out = {}
    for parallel in (False, True):
        c = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={**cfg.data.env_kwargs,
                                                                                   "parallel": parallel}))
        eng = Counting(TorchEngine(m, tok, prefix_cache_tokens=0))
        t0 = time.perf_counter()
        samples, _ = run_episodes(eng, tok, workflow(c)[0], tasks, roles, num_chains=cfg.rollout.num_chains,
                                  max_turns=cfg.rollout.max_turns, max_model_len=cfg.rollout.max_model_len)
        out[parallel] = (eng.calls, time.perf_counter() - t0, [(s.role, s.completion_ids) for s in samples])
    (a, ta, sa), (b, tb, sb) = out[False], out[True]
    print(f"{config} ({spec or cfg.model.spec}, {len(tasks)} tasks x {cfg.rollout.num_chains} chains): engine calls "
          f"{a} -> {b}, rollout {ta:.1f} s -> {tb:.1f} s ({ta / tb:.2f}x), same turns: {sa == sb}", flush=True)


def extension(n: int, threads: int, reply_tokens: int = 96) -> None:
    import torch
    from agents.math_team import role_messages
    torch.set_num_threads(threads)
    m, tok = load_model("smollm2-135m-instruct")
    eng = TorchEngine(m, tok)
    sp = SamplingParams(max_new_tokens=reply_tokens, temperature=1.0, seed=11)
    judge = "evaluator_critique"
    said = [(f"What is {11 + i} + {40 + i}?", [("generator_initial", f"The sum is 50, so the answer is \\boxed{{50}}.")])
            for i in range(n)]  # a wrong solution, then the judge's first verdict, sampled
    firsts = [role_messages(judge, judge, q, h) for q, h in said]
    res = eng.generate([Request(chat.chat_ids(tok, msgs), None, sp) for msgs in firsts])
    spliced = re_encoded = 0
    for (q, h), msgs, r in zip(said, firsts, res):  # its conversation goes on: a refinement to judge
        second = role_messages(judge, judge, q, h + [(judge, r.text), ("generator_refinement", "It is \\boxed{51}.")])
        ids = chat.chat_ids(tok, msgs)
        full = ids + r.completion_ids
        new = chat.continue_ids(tok, msgs, ids, r.completion_ids, r.text, second)
        spliced += new is not None and new[:len(full)] == full
        re_encoded += chat.chat_ids(tok, second)[:len(full)] == full
    print(f"SmolLM2 sampled judge turns ({reply_tokens} tokens at most), {n} episodes: second turns that extend the first token for token: "
          f"spliced {spliced} of {n}, re-encoded {re_encoded} of {n}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="configs/tiny_video_qa.py,configs/tiny_debate.py")
    ap.add_argument("--model", default=None, help="model spec for the engine-call runs (default: each config's)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reply-tokens", type=int, default=96, help="the judge's first reply, at most")
    ap.add_argument("--calls-only", action="store_true")
    a = ap.parse_args()
    os.chdir(ROOT)
    for c in a.configs.split(","):
        engine_calls(c, a.model, a.tasks, a.threads)
    if not a.calls_only:
        extension(a.episodes, a.threads, a.reply_tokens)


if __name__ == "__main__":
    main()

"""SFT with and without `pack_turns`, in one run on the same turns: the research recipe's researcher.

    python bench/sft_pack.py                      # SmolLM2-135M, 8 conversations, 2 rounds
    python bench/sft_pack.py --model tiny --conversations 4 --rounds 1     # the plumbing, in seconds

The scripted research team (sft.py's teacher) plays the recipe's first --tasks training questions
(configs/cpu/research.py); its researcher turns are tokenised as sft.py does (the chat-formatted prompt
the role saw -> the reply + EOS) and packed (sft.pack_conversations). The first --conversations packed
conversations are the workload: arm `unpacked` runs the forward + backward of sft.loss_sum over their
turns one sequence each, arm `packed` over the conversations, micro-batches of --micro-batch-size rows,
the same reply tokens in the loss (checked: the loss sums agree to 1e-4). Arms alternate, --rounds times;
it prints each arm's tokens read and its median wall, and the ratios, measured in this run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import lora  # noqa: E402
import sft  # noqa: E402
from config import load_config_file  # noqa: E402
from model import load_model  # noqa: E402
from sft_teachers import scripted_teacher, tokenize  # noqa: E402
from workflows import load_data, workflow  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a model spec (default: the recipe's, SmolLM2-135M)")
    ap.add_argument("--tasks", type=int, default=20, help="training questions the teacher plays (the recipe's 20)")
    ap.add_argument("--conversations", type=int, default=8, help="packed conversations timed")
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    tc = load_config_file(str(ROOT / "configs" / "cpu" / "research.py"))
    model, tok = load_model(a.model or tc.model.spec, seed=0)
    make_env, module, _ = workflow(tc)
    adapter_of = {r.name: tc.adapter_of(r) for r in tc.roles}
    exs, _ = scripted_teacher(make_env, module, load_data(tc)[0], tok, adapter_of, {"researcher"}, a.tasks, 0.7)
    exs = [tokenize(e, tok) for e in exs]
    convs = sft.pack_conversations(exs)
    print(f"researcher: {len(exs)} turns in {len(convs)} conversations, {sum(len(e.ids) for e in exs)} -> "
          f"{sum(len(e.ids) for e in convs)} tokens ({sum(len(e.ids) for e in exs) / sum(len(e.ids) for e in convs):.2f}x)")
    packed = convs[:a.conversations]
    ids = {tuple(e.ids) for e in exs}
    unpacked = [e for e in exs if any(tuple(c.ids[:len(e.ids)]) == tuple(e.ids) for c in packed)]  # their turns
    assert len(ids) == len(exs) and sum(c.turns() for c in packed) == len(unpacked)
    lora.add_lora(model, ["researcher"], 16, 32.0, 0.0, ("q_proj", "k_proj", "v_proj", "o_proj"), seed=0)
    lora.set_adapter(model, "researcher")
    model.train()
    arms = {"unpacked": unpacked, "packed": packed}
    times, loss = {k: [] for k in arms}, {}
    for _ in range(a.rounds):
        for name, rows in arms.items():
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            total = 0.0
            for i in range(0, len(rows), a.micro_batch_size):
                s, n = sft.loss_sum(model, rows[i:i + a.micro_batch_size], tok.pad_token_id, "cpu")
                s.backward()
                total += float(s.detach())
            times[name].append(time.perf_counter() - t0)
            loss[name] = total
    assert abs(loss["packed"] - loss["unpacked"]) <= 1e-4 * abs(loss["unpacked"]), loss
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = {k: sum(len(e.ids) for e in v) for k, v in arms.items()}
    print(f"threads {torch.get_num_threads()}, {len(unpacked)} turns ({sum(e.reply_tokens() for e in unpacked)} "
          f"reply tokens), micro-batch {a.micro_batch_size}, {a.rounds} rounds")
    print("| arm | sequences | tokens read | forward + backward (median s) |")
    print("|---|---|---|---|")
    for k in arms:
        print(f"| {k} | {len(arms[k])} | {tokens[k]} | {med[k]:.2f} |")
    print(f"packed / unpacked: tokens {tokens['packed'] / tokens['unpacked']:.2f}, wall {med['packed'] / med['unpacked']:.2f}"
          f" ({med['unpacked'] / med['packed']:.2f}x faster); loss sums {loss['unpacked']:.3f} / {loss['packed']:.3f}")


if __name__ == "__main__":
    main()

"""SFT's training (sft.py step 5): turns packed into conversations (pack_turns), optimizer steps of whole
sequences, padded batches, the masked token loss over reply spans, and one adapter's loop with its held-out loss
and plot. sft.py builds the examples and calls train_adapter once per adapter; these names are re-exported there."""
from __future__ import annotations

import dataclasses
import math
import zlib
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import lora
import ppo
from learner import chunkable_head, final_hidden
from sft_teachers import Example


def pack_conversations(examples: list[Example]) -> list[Example]:
    """pack_turns: one sequence per conversation. An example whose tokens begin with another's whole
    sequence (its prompt + reply (+ EOS) re-rendered token for token in the next prompt) is appended to
    it, its reply one more loss span; what lies between (observations, template tokens) is context only.
    Where two turns extend the same one, the shorter (then the earlier in input order) joins it and the
    other keeps its own sequence. The packed sequences come in the order of their first turns. Token for
    token, so a template that rewrites the history, or a reply that re-tokenises differently in the next
    prompt, stays apart."""
    open_ends: dict[tuple, list[int]] = defaultdict(list)  # (length, last 8 tokens) -> chains ending there
    chains: list[list[Example]] = []
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].ids), i))  # a turn after its prefixes
    first_index = []
    for i in order:
        e = examples[i]
        joined = None
        for n in sorted({k[0] for k in open_ends if k[0] <= e.n_prompt}, reverse=True):  # the longest prefix
            for c in open_ends.get((n, tuple(e.ids[max(0, n - 8):n])), []):
                if e.ids[:n] == chains[c][-1].ids:
                    joined = c
                    break
            if joined is not None:
                break
        if joined is None:
            chains.append([e])
            first_index.append(i)
            joined = len(chains) - 1
        else:
            last = chains[joined][-1].ids
            open_ends[(len(last), tuple(last[-8:]))].remove(joined)
            chains[joined].append(e)
        open_ends[(len(e.ids), tuple(e.ids[-8:]))].append(joined)
    out = []
    for c in sorted(range(len(chains)), key=lambda c: first_index[c]):
        turns = chains[c]
        if len(turns) == 1:
            out.append(turns[0])
            continue
        last = turns[-1]
        out.append(dataclasses.replace(last, source=turns[0].source, n_prompt=turns[0].n_prompt,
                                       spans=[s for t in turns for s in t.reply_spans()]))
    return out


def steps_of(units: list[Example], order: list[int], per_step: int) -> list[list[Example]]:
    """`order`'s units, in turn, into optimizer steps of at most per_step turns (a longer unit alone): one
    turn per unit gives the fixed slices order[s*per_step:(s+1)*per_step]."""
    steps, cur, n = [], [], 0
    for i in order:
        t = units[i].turns()
        if cur and n + t > per_step:
            steps.append(cur)
            cur, n = [], 0
        cur.append(units[i])
        n += t
    if cur:
        steps.append(cur)
    return steps


def batch(examples: list[Example], pad_id: int, device):
    """ids (B, L), attention (B, L), mask (B, L-1): 1 on target columns that are reply tokens."""
    L = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    attn = torch.zeros(len(examples), L, dtype=torch.long)
    mask = torch.zeros(len(examples), L - 1)
    for i, e in enumerate(examples):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attn[i, :len(e.ids)] = 1
        for a, b in e.reply_spans():
            mask[i, a - 1:b - 1] = 1  # column t predicts token t+1
    return ids.to(device), attn.to(device), mask.to(device)


def loss_sum(model, examples: list[Example], pad_id: int, device, chunk: int = 256) -> tuple[torch.Tensor, int]:
    """(sum of the reply tokens' cross-entropy, their number) over one micro-batch. chunk (SFTConfig's
    logits_chunk_tokens): the vocabulary projection runs that many tokens at a time, its backward by hand
    (ppo.head_logprobs), so the whole (tokens x vocabulary) logits are never made; 0, or a model whose logits are
    not lm_head(norm(h)) alone (learner.chunkable_head): whole logits."""
    ids, attn, mask = batch(examples, pad_id, device)
    start = min(e.reply_spans()[0][0] for e in examples) - 1  # no logits before the first reply token
    W = chunkable_head(model) if chunk else None
    if W is not None:
        h = final_hidden(model, input_ids=ids, attention_mask=attn)[:, start:-1]
        ce = -ppo.head_logprobs(h, W, ids[:, start + 1:], torch.ones(len(examples), device=h.device), chunk)[0]
    else:
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=ids.shape[1] - start).logits[:, :-1]  # (B, T, V)
        ce = F.cross_entropy(logits.float().flatten(0, 1), ids[:, start + 1:].flatten(), reduction="none")
    m = mask[:, start:]  # (B, T)
    return (ce.view_as(m) * m).sum(), int(m.sum())


@torch.no_grad()
def mean_loss(model, adapter: str, examples: list[Example], mb: int, pad_id: int, device, chunk: int = 256) -> float | None:
    """Token-mean loss of `adapter` on `examples` (None when there are none); chunk: as loss_sum."""
    if not examples:
        return None
    lora.set_adapter(model, adapter)
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(examples), mb):
        s, k = loss_sum(model, examples[i:i + mb], pad_id, device, chunk)
        tot, n = tot + float(s), n + k
    return tot / max(n, 1)


def train_adapter(model, adapter: str, train: list[Example], val: list[Example], cfg, pad_id: int,
                  device, log, eval_hook=None) -> dict:
    """epochs x optimizer steps (grad_accum micro-batches each) of AdamW on `adapter` only; more epochs
    while fewer than min_steps steps are done (whole epochs: every example as often as the others)."""
    params = lora.adapter_parameters(model, adapter)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed + zlib.crc32(adapter.encode()))  # str hash() is salted
    per_step = cfg.micro_batch_size * cfg.grad_accum
    steps_per_epoch = math.ceil(sum(e.turns() for e in train) / per_step)  # packed: at least this many
    total = max(cfg.epochs, math.ceil(cfg.min_steps / steps_per_epoch)) * steps_per_epoch if train else 0  # the bar's
    step, epoch, skipped, losses = 0, 0, 0, []

    def evaluate():
        row = {"adapter": adapter, "step": step, "val_loss": mean_loss(model, adapter, val, cfg.micro_batch_size,
                                                                       pad_id, device, cfg.logits_chunk_tokens)}
        if eval_hook is not None:
            row.update(eval_hook(model, adapter, step) or {})
        log(row)
        return row["val_loss"]

    val_before = evaluate()
    bar = tqdm(total=total, desc=f"sft {adapter}", disable=not cfg.progress, leave=False)
    while train and (epoch < cfg.epochs or step < cfg.min_steps):
        order = torch.randperm(len(train), generator=gen).tolist()
        groups = steps_of(train, order, per_step)
        for s, group in enumerate(groups):
            n_tok = sum(e.reply_tokens() for e in group)  # the loss is the mean over the step's reply tokens
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
            for g in opt.param_groups:
                g["lr"] = lr
            lora.set_adapter(model, adapter)
            model.train()  # LoRA dropout, if the role asked for it
            step_loss = 0.0
            for i in range(0, len(group), cfg.micro_batch_size):
                ls, _ = loss_sum(model, group[i:i + cfg.micro_batch_size], pad_id, device, cfg.logits_chunk_tokens)
                (ls / n_tok).backward()
                step_loss += float(ls.detach())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
            if math.isfinite(grad_norm):
                opt.step()
            else:  # a non-finite gradient: skip the step, weights untouched
                skipped += 1
            opt.zero_grad(set_to_none=True)
            step += 1
            losses.append(step_loss / n_tok)
            log({"adapter": adapter, "step": step, "epoch": epoch + (s + 1) / len(groups), "loss": losses[-1],
                 "lr": lr, "grad_norm": grad_norm, "tokens": n_tok})
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            last = s == len(groups) - 1 and epoch + 1 >= cfg.epochs and step >= cfg.min_steps
            if cfg.eval_every and step % cfg.eval_every == 0 and not last:  # the last step's eval follows below
                evaluate()
        epoch += 1
    bar.close()
    val_after = evaluate()
    lora.set_adapter(model, None)
    return {"steps": step, "epochs": epoch, "skipped": skipped, "train_loss_first": losses[0] if losses else None,
            "train_loss_last": losses[-1] if losses else None, "val_loss_before": val_before, "val_loss_after": val_after,
            "train_examples": sum(e.turns() for e in train), "val_examples": sum(e.turns() for e in val),
            "train_sequences": len(train), "val_sequences": len(val)}  # examples are turns; packed, fewer sequences


def plot(rows: list[dict], path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, a in enumerate(sorted({r["adapter"] for r in rows})):
        color = f"C{i}"
        tr = [(r["step"], r["loss"]) for r in rows if r["adapter"] == a and "loss" in r]
        va = [(r["step"], r["val_loss"]) for r in rows if r["adapter"] == a and r.get("val_loss") is not None]
        if tr:
            ax.plot(*zip(*tr), color=color, label=f"{a} train")
        if va:
            ax.plot(*zip(*va), color=color, ls="--", marker="o", label=f"{a} held-out")
    ax.set(title="SFT loss per adapter (reply tokens)", xlabel="optimizer step", ylabel="loss")
    if ax.get_lines():
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

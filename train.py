"""troupe's trainer: several roles, one base model, one LoRA adapter per role, PPO/GRPO updates.

    python train.py --config configs/tiny_math_3agent.py                 # CPU, under a minute
    python train.py --config configs/smollm2_math_cpu.py                 # the CPU demo
    torchrun --nproc_per_node 8 train.py --config configs/math_3agent.py # GPUs, FSDP2 + vLLM
    python train.py --config configs/X.py --algo.adv-estimator rloo --trainer.total-steps 10

One step, as `main` reads:
  next tasks -> rollout (every role's turns, one engine) -> per adapter: score (old logprobs,
  reference logprobs with adapters off, critic values) -> advantages (groups = (task, role[, turn])
  across the num_chains episodes of a task) -> update (ppo_epochs x mini-batches x micro-batches,
  its own AdamW) -> sync the engine -> log -> eval -> save.
The algorithm lives in ppo.py (ADVANTAGES, LOSSES); this file only feeds it tensors.

Distributed (torchrun): each rank rolls out its share of the tasks (all chains of a task on one
rank, so groups are local), the model is FSDP2-sharded per decoder layer then at the root, the
loss is normalised by the global token count, metrics are reduced, rank 0 logs and writes
checkpoints. Batch-whitened estimators (reinforce++, gae) whiten per rank.

Deliberately left out: sequence packing, context parallelism, async rollouts, a reward model;
GAE's value model is a linear head on the shared base wearing its own "critic" adapter.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import lora
import ppo
import trajectories
from batch import (Critic, RoleBatch, adapter_divergence, all_sum, backward, clip_grad, forward_logits, gather_objects,
                   lockstep_chunks, score, window)
from config import Config, ConfigError, load_config_file, pop_config_arg
from model import load_model
from rollout import RoleSpec, SamplingParams, Step, TorchEngine, merge_turns, run_episodes
from rewards.calculator import RewardCalculator, rescore_episodes
from rundir import (Logger, config_changes, duration, fmt, load_adapters, load_checkpoint, resolve_resume,
                    save_checkpoint)
from workflows import check_roles, load_data, workflow

RANK, WORLD = 0, 1


def print0(*a, **k):
    if RANK == 0:
        print(*a, **k, flush=True)


# --------------------------------------------------------------------------------------------
# ALGO LOGIC: rewards -> advantages -> the clipped policy update (the math itself is in ppo.py)


def advantages(cfg: Config, rb: RoleBatch, kl_tok, values, kl_coef, estimator: str | None = None):
    """Token rewards (outcome score on the last token, minus the KL when it is in the reward) ->
    the chosen estimator's (advantages, returns); `estimator`: this adapter's (default algo's)."""
    a = cfg.algo
    token_rewards = torch.zeros_like(rb.mask)  # (N, T)
    token_rewards[torch.arange(len(rb.steps)), rb.last] = rb.scores
    if kl_tok is not None and a.kl_in_reward:
        token_rewards = token_rewards - kl_coef * kl_tok * rb.mask
    gids = [(s.task_id, s.role, s.turn if a.group_by_turn else 0) if not s.info.get("dummy") else ("dummy", i)
            for i, s in enumerate(rb.steps)]
    baseline = torch.tensor([float(s.info.get("baseline", 0.0)) for s in rb.steps])  # ReMax's greedy reward
    return ppo.ADVANTAGES[estimator or a.adv_estimator](token_rewards, rb.mask, group_ids=gids, values=values, baseline=baseline,
                                           gamma=a.gamma, lam=a.lam, norm_by_std=a.norm_by_std)


@dataclass
class Part:
    """One adapter's share of a step, ready for the policy update."""
    adapter: str
    rb: RoleBatch
    adv: torch.Tensor  # (N, T) advantages
    old_logp: torch.Tensor  # (N, T) logprobs of the policy that sampled (or recomputed)
    ref_logp: torch.Tensor | None  # (N, T) under the reference (adapters off), when KL is in the loss
    opt: torch.optim.Optimizer
    sched: object
    gen: torch.Generator  # its mini-batch permutations


def policy_update(model, parts: list[Part], cfg, device, kl_coef) -> dict[str, dict]:
    """ppo_epochs x mini-batches x micro-batches for one or more adapters at once. Each part keeps its
    own permutation, mini-batches, loss denominators, grad clip and optimizer step; only the forward
    and backward of a micro-batch are shared, each row wearing its own adapter. The adapters are
    disjoint and the base is frozen, so a part's gradient is what it would get alone (one part =
    the sequential reference, algo.fused_update=False). A non-finite loss or gradient skips that
    optimizer step (grads dropped, weights untouched) and is counted in `skipped`; when fused, a
    non-finite row can poison the other parts of its micro-batch (NaN * 0), which then skip too."""
    a = cfg.algo
    loss_fn, (clip_low, clip_high), agg = ppo.LOSSES[a.policy_loss], a.clip, a.agg
    kl_in_loss = a.kl_coef > 0 and not a.kl_in_reward
    model.train()  # policy adapters have no dropout, so this forward is the network old_logp came from
    names = [p.adapter for p in parts]
    if len(parts) == 1:
        lora.set_adapter(model, names[0])
    params = {p.adapter: lora.adapter_parameters(model, p.adapter) for p in parts}
    N = {p.adapter: len(p.rb.steps) for p in parts}
    n_mb = {p.adapter: max(1, math.ceil(n / a.mini_batch_size)) for p, n in zip(parts, all_sum([float(N[x]) for x in names]))}
    sums = {x: defaultdict(float) for x in names}  # token-weighted sums, reduced over ranks at the end
    ratio_max, grad_norms = {x: [] for x in names}, {x: [] for x in names}
    skipped, lr = dict.fromkeys(names, 0), {p.adapter: p.opt.param_groups[0]["lr"] for p in parts}
    for epoch in range(a.ppo_epochs):
        perm = {p.adapter: torch.randperm(N[p.adapter], generator=p.gen).tolist() for p in parts}
        for k in range(max(n_mb.values())):
            now = [p for p in parts if k < n_mb[p.adapter]]
            mb = {p.adapter: perm[p.adapter][k * N[p.adapter] // n_mb[p.adapter]:(k + 1) * N[p.adapter] // n_mb[p.adapter]]
                  for p in now}
            counts = [p.rb.mask[mb[p.adapter]].sum() if agg == "token-mean" else (p.rb.mask[mb[p.adapter]].sum(1) > 0).sum()
                      for p in now]
            denom = {p.adapter: max(c, 1.0) for p, c in zip(now, all_sum([float(c) for c in counts]))}  # global
            rows = sorted(((p, r) for p in now for r in mb[p.adapter]), key=lambda x: -int(x[0].rb.rows_len[x[1]]))
            bad, mb_ratio_max = dict.fromkeys(names, False), dict.fromkeys(names, 0.0)
            for chunk, w in lockstep_chunks(rows, a.micro_batch_size, dummy=(now[0], 0)):
                pieces = [(p, [r for q, r in chunk if q is p]) for p in now if any(q is p for q, _ in chunk)]
                batch = [(p.rb, rs) for p, rs in pieces]
                if len(parts) > 1:
                    lora.set_row_adapters(model, [p.adapter for p, rs in pieces for _ in rs])
                logits, tgt, start, T = forward_logits(model, batch, device)
                if kl_in_loss and a.kl_kind == "full":
                    with torch.no_grad():
                        lora.set_adapter(model, None)
                        ref_logits = forward_logits(model, batch, device)[0]
                        if len(parts) > 1:
                            lora.set_row_adapters(model, [p.adapter for p, rs in pieces for _ in rs])
                        else:
                            lora.set_adapter(model, names[0])
                loss, off = 0.0, 0
                for p, rs in pieces:  # each adapter's own loss on its own rows
                    x, sl = p.adapter, slice(off, off + len(rs))
                    off += len(rs)
                    logp = ppo.token_logprobs(logits[sl], tgt[sl])  # (b, T - start)
                    m = window(p.rb.mask, rs, start, T).to(device) * w
                    # before the first optimizer step this forward IS the old policy: ratio exactly 1
                    old = logp.detach() if epoch == 0 and k == 0 else window(p.old_logp, rs, start, T).to(device)
                    pg_loss, pm = loss_fn(logp, old, window(p.adv, rs, start, T).to(device), m, clip_low, clip_high, a.dual_clip,
                                          agg, denom[x], p.rb.norm_len)
                    ent = ppo.entropy(logits[sl] if a.entropy_coef > 0 else logits[sl].detach(), m)  # a metric always
                    part_loss = pg_loss - a.entropy_coef * ppo.agg_loss(ent, m, agg, denom[x], p.rb.norm_len)
                    if kl_in_loss:
                        kl = (ppo.full_kl(logits[sl], ref_logits[sl]) if a.kl_kind == "full"
                              else ppo.kl_penalty(logp, window(p.ref_logp, rs, start, T).to(device), a.kl_kind))
                        kl_loss = ppo.agg_loss(kl, m, agg, denom[x], p.rb.norm_len)
                        part_loss = part_loss + kl_coef * kl_loss
                        sums[x]["kl_loss"] += kl_loss.item()
                    bad[x] |= not bool(torch.isfinite(part_loss))
                    loss = loss + part_loss
                    n = float(m.sum())
                    sums[x]["pg_loss"] += pg_loss.item()
                    sums[x]["tokens"] += n
                    sums[x]["entropy"] += float((ent.detach() * m).sum())
                    for key in ("clipfrac", "approx_kl"):
                        sums[x][key] += pm[key] * n
                    if n:
                        mb_ratio_max[x] = max(mb_ratio_max[x], pm["ratio_max"])
                backward(loss)
            flags = all_sum([float(bad[p.adapter]) for p in now])
            for p, flag in zip(now, flags):
                x = p.adapter
                ratio_max[x].append(mb_ratio_max[x])
                norm = clip_grad(params[x], a.grad_clip)
                if flag or not math.isfinite(norm):  # every rank skips together
                    skipped[x] += 1
                    p.opt.zero_grad(set_to_none=True)
                    continue
                lr[x] = p.opt.param_groups[0]["lr"]  # the rate this optimizer step used
                p.opt.step()
                p.opt.zero_grad(set_to_none=True)
                grad_norms[x].append(norm)
    out = {}
    for x in names:
        keys = sorted(sums[x])
        tot = dict(zip(keys, all_sum([sums[x][k] for k in keys])))
        rmax = np.max(gather_objects(ratio_max[x]), axis=0)  # (epochs x mini-batches,) max over ranks
        o = {k: tot[k] / max(tot["tokens"], 1.0) for k in ("entropy", "clipfrac", "approx_kl")}
        o["pg_loss"] = tot["pg_loss"] / (a.ppo_epochs * n_mb[x])  # mean over mini-batches of the loss stepped on
        if "kl_loss" in tot:
            o["kl_loss"] = tot["kl_loss"] / (a.ppo_epochs * n_mb[x])
        o.update(ratio_max=float(rmax.max()), ratio_max_first=float(rmax[0]), skipped=skipped[x], lr=lr[x])
        if grad_norms[x]:
            o["grad_norm"] = float(np.mean(grad_norms[x]))
        out[x] = o
    lora.set_adapter(model, None)
    return out


# --------------------------------------------------------------------------------------------
# one adapter's share of a step: score -> advantages -> (critic); then the policy update


def prepare_adapter(run, adapter: str, steps: list[Step], step: int, step_seed: int) -> tuple[Part | None, dict]:
    """Everything one adapter does in a step before its policy update; returns its Part (None when
    it is not updated: frozen, or the critic is warming up) and its metrics (keys without the name)."""
    cfg, a, model, device = run.cfg, run.cfg.algo, run.model, run.device
    roles = [r for r in cfg.roles if cfg.adapter_of(r) == adapter]
    if not steps:  # another rank has turns of this adapter: a zero-weight dummy keeps collectives in step
        pad = run.tok.pad_token_id
        steps = [Step(-1, -1, roles[0].name, 0, [pad], [pad], [0.0], info={"dummy": True})]
    temp = {r.name: r.temperature for r in roles}
    rb = RoleBatch(steps, [temp[s.role] for s in steps], run.tok.pad_token_id, max(r.max_tokens for r in roles))
    out = {}
    model.eval()
    old_logp = rb.sample_logp if run.old_from_sampling else score(model, rb, adapter, cfg, device)
    if not run.old_from_sampling:
        gap, n = all_sum([float((old_logp - rb.sample_logp).abs().mul(rb.mask).sum()), float(rb.mask.sum())])
        out["logprob_gap"] = gap / max(n, 1.0)  # engine vs trainer, mean |delta logp| per token
    ref_logp = kl_tok = None
    if a.kl_coef > 0:
        if a.kl_kind == "full":
            kl_tok = score(model, rb, adapter, cfg, device, full_kl_to_ref=True)
        else:
            ref_logp = score(model, rb, None, cfg, device)
            kl_tok = ppo.kl_penalty(old_logp, ref_logp, a.kl_kind)
        kl_sum, n = all_sum([float((kl_tok * rb.mask).sum()), float(rb.mask.sum())])
        out["kl"] = kl_sum / max(n, 1.0)  # token mean, this adapter's
        seq_mean, n_seq = ppo.sequence_mean_kl(kl_tok, rb.mask)
        out["kl_seq_sum"], out["kl_seqs"] = seq_mean * n_seq, float(n_seq)  # for the controller; summed over ranks
    estimator = cfg.estimator_of(roles[0])  # roles sharing an adapter share it (validate)
    critic = run.critic if estimator == "gae" else None
    values = critic.values(model, rb) if critic else None
    adv, returns = advantages(cfg, rb, kl_tok, values, run.kl_ctrl.value, estimator)
    for s, a_mean in zip(steps, (adv * rb.mask).sum(1) / rb.mask.sum(1).clamp(min=1)):
        s.info["advantage"] = float(a_mean)  # for the trajectory files
    if critic:
        out.update(critic.update(model, rb, returns, values))
    lora.set_adapter(model, None)
    if adapter not in run.opts or (critic and step <= a.critic_warmup_steps) or step <= roles[0].frozen_steps:
        return None, out
    gen = torch.Generator().manual_seed(step_seed + zlib.crc32(adapter.encode()) % 1000)  # str hash() is salted
    return Part(adapter, rb, adv, old_logp, ref_logp, run.opts[adapter], run.scheds[adapter], gen), out


# --------------------------------------------------------------------------------------------
# rollouts: the task stream, DAPO's dynamic sampling, metrics, eval


def role_specs(cfg: Config, step_seed: int | None, greedy=False) -> dict[str, RoleSpec]:
    r = cfg.rollout
    return {ro.name: RoleSpec(cfg.adapter_of(ro), SamplingParams(
        max_new_tokens=ro.max_tokens, temperature=ro.temperature, top_p=r.top_p, top_k=r.top_k, greedy=greedy,
        seed=step_seed)) for ro in cfg.roles}


def rollout(engine, tok, cfg, tasks, task_ids, roles, num_chains, progress=False, baseline_roles=None):
    """run_episodes on this rank's tasks, with global task ids (groups and seeds do not depend on
    how tasks were split over ranks)."""
    steps, eps = run_episodes(engine, tok, workflow(cfg)[0], tasks, roles, num_chains=num_chains,
                              max_turns=cfg.rollout.max_turns, max_model_len=cfg.rollout.max_model_len,
                              progress=progress and RANK == 0, seed_ids=task_ids, baseline_roles=baseline_roles)
    for e in eps:
        e.task_id = task_ids[e.task_id]
        for s in e.steps:
            s.task_id = e.task_id
    return steps, eps


def group_key(cfg: Config, s: Step):
    return s.task_id, s.role, s.turn if cfg.algo.group_by_turn else 0


def informative(cfg: Config, steps: list[Step]) -> list[Step]:
    """DAPO's filter: drop the groups whose advantages are zero by construction, i.e. groups of more
    than one turn whose rewards all agree, for the roles whose estimator centres per group (grpo,
    rloo, reinforce++_baseline). A group of one stays (its grpo/rloo advantage is its reward, as
    in verl), and so does every turn of a role whose estimator does not centre per group (remax,
    reinforce++, gae: there a flat group still has advantages)."""
    est = {r.name: cfg.estimator_of(r) for r in cfg.roles}
    groups = defaultdict(list)
    for s in steps:
        groups[group_key(cfg, s)].append(s.reward)
    flat = {k for k, r in groups.items()
            if est.get(k[1], cfg.algo.adv_estimator) in ppo.GROUPED and len(r) > 1 and max(r) == min(r)}
    return [s for s in steps if group_key(cfg, s) not in flat]


def mixed_label_groups(cfg: Config, steps: list[Step]) -> list[Step]:
    """Leave out the groups of several labelled turns whose labels all agree (env.turn_labels: e.g. a
    judge's verdicts on solutions that were all right, where it can only learn the task's difficulty)."""
    labels = defaultdict(set)
    for s in steps:
        if "label" in s.info:
            labels[group_key(cfg, s)].add(s.info["label"])
    n = defaultdict(int)
    for s in steps:
        n[group_key(cfg, s)] += 1
    uniform = {k for k, v in labels.items() if len(v) == 1 and n[k] > 1}
    return [s for s in steps if group_key(cfg, s) not in uniform]


def dapo_batch(cfg: Config, steps: list[Step]) -> list[Step]:
    """The filter, then DAPO's trim: the informative groups of the first data.batch_size tasks (in
    stream order, over all ranks) that kept any, so refill rounds never grow the batch."""
    kept = informative(cfg, steps)
    tasks = sorted({t for part in gather_objects(sorted({s.task_id for s in kept})) for t in part})
    first = set(tasks[:cfg.data.batch_size])
    return [s for s in kept if s.task_id in first]


def collect(run, train_tasks, step_seed):
    """This step's episodes: batch_size new tasks from the seeded stream, plus, under dynamic
    sampling with refill, more batches while fewer than batch_size tasks kept an informative group."""
    cfg, B = run.cfg, run.cfg.data.batch_size
    steps, eps, rounds = [], [], 0
    baseline = role_specs(cfg, None, greedy=True) if "remax" in cfg.estimators else None
    while True:
        ids = []  # (global task id = position in the stream, task index): a seeded permutation per epoch
        for _ in range(B):
            epoch, pos = divmod(run.cursor, len(train_tasks))
            perm = np.random.RandomState(cfg.trainer.seed + epoch).permutation(len(train_tasks))
            ids.append((run.cursor, int(perm[pos])))
            run.cursor += 1
        mine = ids[RANK::WORLD]
        s, e = rollout(run.engine, run.tok, cfg, [train_tasks[i] for _, i in mine], [g for g, _ in mine],
                       role_specs(cfg, step_seed), cfg.rollout.num_chains, cfg.rollout.progress, baseline)
        if cfg.data.reward == "calculator":  # the weighted components replace the env's reward (kept in info)
            rescore_episodes(RewardCalculator.from_config(cfg), e)
        steps, eps = steps + s, eps + e
        if not cfg.algo.dynamic_sampling or rounds == cfg.algo.dynamic_sampling_max_rounds:
            return steps, eps, rounds
        if all_sum(float(len({x.task_id for x in informative(cfg, steps)}))) >= B:
            return steps, eps, rounds
        rounds += 1


def summarize(cfg: Config, steps: list[Step], eps, prefix: str) -> dict:
    """Per-role reward (mean, std, min, max) and response length, the mean of every episode metric,
    and the workflow's own aggregate; reduced over ranks."""
    out = {}
    every = [x for part in gather_objects([(e.metrics, [(s.role, s.reward, len(s.completion_ids)) for s in e.steps],
                                            e.truncated) for e in eps]) for x in part]
    for r in cfg.roles:
        rew = np.array([w for _, st, _ in every for role, w, _ in st if role == r.name])
        lens = [n for _, st, _ in every for role, _, n in st if role == r.name]
        if len(rew):
            out.update({f"{prefix}/reward/{r.name}": float(rew.mean()), f"{prefix}/reward_std/{r.name}": float(rew.std()),
                        f"{prefix}/reward_min/{r.name}": float(rew.min()), f"{prefix}/reward_max/{r.name}": float(rew.max()),
                        f"{prefix}/response_len/{r.name}": float(np.mean(lens))})
    metrics = [m for m, _, _ in every if m]
    for k in sorted({k for m in metrics for k in m}):
        out[f"{prefix}/{k}"] = float(np.mean([m.get(k, 0.0) for m in metrics]))
    if every:
        out[f"{prefix}/truncated"] = float(np.mean([t for _, _, t in every]))
    env_module = workflow(cfg)[1]
    if hasattr(env_module, "aggregate"):  # what is the workflow's own (e.g. an evaluator's precision)
        from rollout import Episode
        light = [Episode(0, 0, None, [Step(0, 0, role, 0, [], [0] * n, [], reward=w) for role, w, n in st], m)
                 for m, st, _ in every]
        out.update({f"{prefix}/{k}": v for k, v in env_module.aggregate(light).items()})
    return out


def evaluate(run, val_tasks, out: Path | None = None, logger=None) -> dict:
    """Greedy episodes on the validation tasks; when `out` is given, writes them all, prints one and
    puts the first few in the logger's wandb table (the same tasks at every eval)."""
    mine = list(range(RANK, len(val_tasks), WORLD))
    steps, eps = rollout(run.engine, run.tok, run.cfg, [val_tasks[i] for i in mine], mine,
                         role_specs(run.cfg, None, greedy=True), 1, progress=run.cfg.rollout.progress)
    if out is not None:
        records = save_trajectories(run, eps, out / "trajectories" / f"val_step_{run.step:06d}.jsonl", "val", 1.0)
        if records:
            print0(trajectories.show(records[0]))
            if logger is not None:
                logger.episodes(run.step, records)
    return eval_metrics(run, steps, eps, "val")


def eval_metrics(run, steps: list[Step], eps, prefix: str) -> dict:
    """summarize(), plus how far the adapters have moved apart (and from the base): adapter_kl/a~b on
    the same (first 16) turns for every adapter."""
    metrics = summarize(run.cfg, steps, eps, prefix)
    sample = steps[:16] or [Step(-1, -1, run.cfg.roles[0].name, 0, [run.tok.pad_token_id], [run.tok.pad_token_id],
                                 [0.0], info={"dummy": True})]
    rb = RoleBatch(sample, [1.0] * len(sample), run.tok.pad_token_id, 1)
    div = adapter_divergence(run.model, rb, list(run.cfg.adapters) + [None], run.device, run.cfg.algo.micro_batch_size)
    metrics.update({f"{prefix}/adapter_kl/{k}": v for k, v in div.items()})
    return metrics


def save_trajectories(run, eps, path: Path, split: str, fraction: float) -> list[dict]:
    """Every 1/fraction-th episode of every rank, as records (trajectories.py), written by rank 0."""
    every = max(1, round(1 / fraction)) if fraction > 0 else 0
    mine = [trajectories.episode_record(e, run.tok, split, run.step) for e in eps if every and e.episode_id % every == 0]
    records = sorted((r for part in gather_objects(mine) for r in part), key=lambda r: (r["task_id"], r["episode_id"]))
    if RANK == 0 and records:
        trajectories.write(path, records)
    return records


def empty_reason(cfg: Config, steps: list[Step], eps) -> str | None:
    """Why this step trains on nothing, or None."""
    trainable = {r.name for r in cfg.roles if r.trainable}
    n_tok, n_trunc, n_eps = all_sum([float(sum(len(s.completion_ids) for s in steps if s.role in trainable)),
                                     float(sum(e.truncated and not e.steps for e in eps)), float(len(eps))])
    if n_tok > 0:
        return None
    if n_eps and n_trunc == n_eps:
        return (f"every episode was truncated before its first turn: prompt + max_tokens > rollout.max_model_len="
                f"{cfg.rollout.max_model_len}")
    return "no trainable role produced a token"


# --------------------------------------------------------------------------------------------


class Run:
    """The live objects of a run and the counters a checkpoint restores."""

    def __init__(self, cfg, model, tok, device):
        self.cfg, self.model, self.tok, self.device = cfg, model, tok, device
        self.step, self.cursor, self.wandb_id = 0, 0, None  # cursor: next position in the task stream
        self.opts, self.scheds, self.critic, self.engine = {}, {}, None, None
        a = cfg.algo
        self.kl_ctrl = (ppo.AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_adaptive
                        else ppo.FixedKLController(a.kl_coef))
        self.old_from_sampling = a.recompute_old_logprobs == "never" or (
            a.recompute_old_logprobs == "auto" and cfg.rollout.engine == "torch" and cfg.model.dtype in ("float32", "fp32")
            and cfg.rollout.top_p == 1.0 and cfg.rollout.top_k == 0 and not cfg.model.gradient_checkpointing)


# --------------------------------------------------------------------------------------------


def init_distributed():
    global RANK, WORLD
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        RANK, WORLD = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def build(cfg: Config, ckpt: Path | None):
    """Model, adapters (restored from `ckpt` if resuming), sharding, optimizers, engine."""
    device = init_distributed()
    t_cfg, a = cfg.trainer, cfg.algo
    out = Path(t_cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(t_cfg.seed)
    np.random.seed(t_cfg.seed)
    torch.manual_seed(t_cfg.seed)
    model, tok = load_model(cfg.model.spec, cfg.model.dtype, device, seed=t_cfg.seed)
    for m in model.modules():  # RL forwards use no dropout anywhere: old and new logprobs need one network
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inits = {cfg.adapter_of(r): r.init_from for r in cfg.roles if r.init_from}  # e.g. sft.py's adapters
    fresh = defaultdict(list)  # (rank, alpha, targets) -> adapters: one add_lora per setting (one when no role sets its own)
    for x in cfg.adapters:
        if x not in inits:
            fresh[cfg.lora_of(cfg.role_of_adapter(x))].append(x)
    for (rank, alpha, targets), names in fresh.items():
        lora.add_lora(model, names, rank, alpha, 0.0, targets, seed=t_cfg.seed)
    for name, path in inits.items():
        lora.load_adapter(model, name, path)  # its own rank and alpha; a policy adapter never drops out
        for m in lora.lora_modules(model).values():
            m.dropout_p[name] = 0.0
        model._lora_config[name]["lora_dropout"] = 0.0
    run = Run(cfg, model, tok, device)
    run.critic = Critic(model, cfg, device) if "gae" in cfg.estimators else None
    if ckpt is not None:  # adapters go into the plain model, before sharding
        load_adapters(model, ckpt, cfg.adapters + (["critic"] if run.critic else []))
    if WORLD > 1:
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    for name in cfg.trainable_adapters:
        run.opts[name] = torch.optim.AdamW(lora.adapter_parameters(model, name), lr=cfg.lr_of(cfg.role_of_adapter(name)),
                                           weight_decay=a.weight_decay)
        run.scheds[name] = torch.optim.lr_scheduler.LambdaLR(
            run.opts[name], lambda s: min(1.0, (s + 1) / a.warmup_steps) if a.warmup_steps else 1.0)
    if run.critic:
        run.critic.make_optimizer(model)
    if cfg.rollout.engine == "vllm":
        from engines import VLLMEngine
        run.engine = VLLMEngine(model, tok, adapters=cfg.adapters, max_model_len=cfg.rollout.max_model_len,
                                seed=t_cfg.seed, gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization)
    else:
        run.engine = TorchEngine(model, tok, max_batch_size=cfg.rollout.max_batch_size, seed=t_cfg.seed,
                                 compile=cfg.rollout.compile)
    if ckpt is not None:
        load_checkpoint(run, ckpt)
    return run, out


def main(cfg: Config):
    cfg.validate()
    check_roles(cfg)
    train_tasks, val_tasks = load_data(cfg)
    if cfg.mode != "rl":
        import sft
        cfg = sft.stage(cfg)
        if cfg is None:
            return {}
    ckpt = resolve_resume(cfg, Path(cfg.trainer.output_dir))
    changes = config_changes(cfg, ckpt) if ckpt is not None and (ckpt / "config.json").exists() else []
    if changes and not (cfg.trainer.resume_if_changed or cfg.trainer.eval_only):
        raise ConfigError(f"config field trainer.resume: {ckpt} was written with another config ({'; '.join(changes)}); "
                          "resuming would mix the two (its optimizer state, for one, keeps the old lr). Pass "
                          "--trainer.resume-if-changed to resume anyway, or --trainer.output-dir NEW to start fresh")
    run, out = build(cfg, ckpt)
    if ckpt is not None:
        print0(f"resumed from {ckpt} (step {run.step})" + (f"; changed: {'; '.join(changes)}" if changes else ""))
    n_base = sum(p.numel() for n, p in run.model.named_parameters() if ".lora_" not in n)
    inits = {cfg.adapter_of(r): r.init_from for r in cfg.roles if r.init_from}
    per = {n: sum(p.numel() for p in lora.adapter_parameters(run.model, n)) for n in cfg.adapters}
    print0(f"model {cfg.model.spec} ({n_base / 1e6:.1f}M params, {cfg.model.dtype}) | adapters (trainable params): "
           + ", ".join(f"{n} {v / 1e6:.2f}M" + ("" if n in run.opts else " frozen")
                       + (f" from {inits[n]}" if n in inits and ckpt is None else "") for n, v in per.items())
           + f" | tasks: {len(train_tasks)} train, {len(val_tasks)} val | engine {cfg.rollout.engine} | {WORLD} rank(s)"
           + f" | output {out}")
    t_cfg, a = cfg.trainer, cfg.algo
    total = t_cfg.total_epochs * max(1, len(train_tasks) // cfg.data.batch_size) if t_cfg.total_epochs else t_cfg.total_steps
    if t_cfg.eval_only:  # results go next to the checkpoint; the training log is never touched
        metrics = evaluate(run, val_tasks)
        if RANK == 0:
            (ckpt / "eval_metrics.json").write_text(json.dumps({"step": run.step, **metrics}, indent=1))
            print(f"[eval of {ckpt}] " + fmt(metrics, "val"), flush=True)
        return finish(metrics)
    if run.step >= total:
        print0(f"note: {out} already finished at step {run.step} of {total}: nothing to train. Raise "
               "--trainer.total-steps to go on, or start anew with --trainer.output-dir NEW (or --trainer.resume none)")
    logger = Logger(run, out)
    if t_cfg.val_before_train and run.step == 0:
        metrics = evaluate(run, val_tasks, out, logger)
        logger.log(0, metrics, "[eval step 0] " + fmt(metrics, "val"))

    # --- the loop -----------------------------------------------------------------------------
    metrics, empty_in_a_row, t_loop, first = {}, 0, time.perf_counter(), run.step + 1
    for step in range(run.step + 1, total + 1):
        run.step = step
        t0 = time.perf_counter()
        step_seed = (t_cfg.seed * 1_000_003 + step * 7_919) % (2**31)
        steps, eps, extra_rounds = collect(run, train_tasks, step_seed)
        n_tokens = all_sum(float(sum(len(s.completion_ids) for s in steps)))
        t_roll = time.perf_counter() - t0
        metrics = summarize(cfg, steps, eps, "train")
        metrics["train/gen_tokens"] = n_tokens  # every role's generated tokens this step (the token budget arms compare)
        if cfg.rollout.merge_turns:
            steps = merge_turns(steps)
        kept = dapo_batch(cfg, steps) if a.dynamic_sampling else steps
        if any("label" in s.info for s in kept):  # the env labelled turns: uniform groups leave the update
            n_lab, before = all_sum([float(sum("label" in s.info for s in kept)), float(len(kept))])
            kept = mixed_label_groups(cfg, kept)
            metrics["train/labelled_turns_dropped"] = (before - all_sum(float(len(kept)))) / max(n_lab, 1.0)
        if a.dynamic_sampling:
            n_kept, n_all = all_sum([float(len(kept)), float(len(steps))])
            metrics.update({"train/kept_frac": n_kept / max(n_all, 1.0), "train/extra_rollouts": float(extra_rounds),
                            "train/kept_tasks": float(len({t for p in gather_objects({s.task_id for s in kept}) for t in p}))})
        silent = [r.name for r in cfg.roles if r.trainable and not metrics.get(f"train/response_len/{r.name}")]
        if silent:
            print0(f"[step {step}] note: role(s) {silent} produced no tokens this step")
        reason = empty_reason(cfg, steps, eps)
        empty_in_a_row = empty_in_a_row + 1 if reason else 0
        if reason:
            print0(f"[step {step}] WARNING: this step trains on nothing: {reason}")
            metrics["train/empty_step"] = 1.0
            if empty_in_a_row >= t_cfg.max_empty_steps:
                raise RuntimeError(f"{empty_in_a_row} steps in a row trained on nothing ({reason}); stopping "
                                   f"(trainer.max_empty_steps={t_cfg.max_empty_steps})")

        # --- per adapter: score -> advantages -> update ----------------------------------------
        t1 = time.perf_counter()
        by_adapter = defaultdict(list)
        for s in kept:
            by_adapter[cfg.adapter_of(next(r for r in cfg.roles if r.name == s.role))].append(s)
        busy = [x for x, n in zip(cfg.adapters, all_sum([float(len(by_adapter[x])) for x in cfg.adapters])) if n]
        bar = tqdm(total=2 * len(busy), desc=f"step {step} update", leave=False,
                   disable=not (cfg.rollout.progress and RANK == 0))
        parts = []
        for adapter in busy:
            part, um = prepare_adapter(run, adapter, by_adapter[adapter], step, step_seed)
            metrics.update({f"train/{k}/{adapter}": v for k, v in um.items()})
            parts += [part] if part else []
            bar.update(1 if part else 2)
        for group in ([parts] if a.fused_update and parts else [[p] for p in parts]):
            for adapter, um in policy_update(run.model, group, cfg, run.device, run.kl_ctrl.value).items():
                metrics.update({f"train/{k}/{adapter}": v for k, v in um.items()})
            bar.update(len(group))
        bar.close()
        for p in parts:  # the LR schedule counts the training steps that updated the adapter (verl's), not optimizer steps
            p.sched.step()
        save_trajectories(run, eps, out / "trajectories" / f"train_step_{step:06d}.jsonl", "train", t_cfg.trajectory_sample)
        seq = [(metrics.pop(k), metrics.pop(k.replace("kl_seq_sum", "kl_seqs"))) for k in list(metrics)
               if k.startswith("train/kl_seq_sum/")]
        if seq:  # verl's current_kl: the mean over every sequence of the step of its token-mean KL
            tot, n_seq = all_sum([sum(x for x, _ in seq), sum(n for _, n in seq)])
            metrics["train/kl"] = tot / max(n_seq, 1.0)
            if a.kl_in_reward:  # the controller moves the in-reward coefficient (config: adaptive needs it)
                run.kl_ctrl.update(metrics["train/kl"], int(n_seq))
        metrics["train/kl_coef"] = run.kl_ctrl.value
        t_train = time.perf_counter() - t1

        # --- sync the engine, log -------------------------------------------------------------
        t2 = time.perf_counter()
        run.engine.sync()
        t_sync = time.perf_counter() - t2
        metrics.update({"time/rollout": t_roll, "time/train": t_train, "time/sync": t_sync,
                        "time/step": time.perf_counter() - t0, "perf/tokens_per_s": n_tokens / max(t_roll, 1e-9),
                        "train/epoch": run.cursor / len(train_tasks)})
        eta = (time.perf_counter() - t_loop) / (step - first + 1) * (total - step)  # evals and saves included
        logger.log(step, metrics, f"[step {step}/{total}] " + fmt(metrics, "train") +
                   f" | {n_tokens / max(t_roll, 1e-9):.0f} tok/s | roll {t_roll:.1f}s train {t_train:.1f}s sync {t_sync:.2f}s"
                   f" | ETA {duration(eta)}")

        # --- eval, then checkpoint (a checkpoint implies every line of its step is logged) -----
        if t_cfg.test_freq and (step % t_cfg.test_freq == 0 or step == total):
            vm = evaluate(run, val_tasks, out, logger)
            metrics.update(vm)
            logger.log(step, vm, f"[eval step {step}] " + fmt(vm, "val"))
            logger.plot(out, [r.name for r in cfg.roles])
        if (t_cfg.save_freq and step % t_cfg.save_freq == 0) or step == total:
            save_checkpoint(run, out)
    logger.plot(out, [r.name for r in cfg.roles])
    return finish(metrics)


def finish(metrics):
    """End a run. Distributed runs synchronise once more, so every rank has finished its
    collectives and files, then `__main__` leaves with os._exit(0): with torch 2.13 + gloo a rank
    was seen to SIGABRT inside destroy_process_group() after correct results (1 run in ~10), and
    tearing the group down buys nothing at process exit."""
    if WORLD > 1 and dist.is_initialized():
        dist.barrier()
    if RANK == 0:
        try:
            import wandb
            if wandb.run is not None:
                wandb.finish()
        except ImportError:
            pass
    return metrics


def cli(argv=None) -> Config:
    """`--config file.py` (or --config=file.py), then tyro overrides on top of it."""
    import tyro
    path, argv = pop_config_arg(sys.argv[1:] if argv is None else argv)
    try:
        base = load_config_file(path) if path else Config()
    except (FileNotFoundError, TypeError) as e:  # a missing file or one without `config`: one line, not a traceback
        raise ConfigError(f"--config: {e}") from None
    desc = (__doc__.split("\n")[0] + "\n\n--config PATH (or --config=PATH): a configs/*.py file building `config = "
            "Config(...)`; it goes first and the flags below override its fields (defaults shown are the file's).")
    return tyro.cli(Config, default=base, args=argv, description=desc)


if __name__ == "__main__":
    from data.math_data import DataError
    try:
        main(cli())
    except (ConfigError, DataError) as e:  # bad input: one clear line, not a traceback
        sys.exit(f"error: {e}")
    if WORLD > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

"""troupe's trainer: several roles, one base model, one LoRA adapter per role, PPO/GRPO updates.

    python train.py --config configs/tiny_math_3agent.py                 # CPU, under a minute
    python train.py --config configs/smollm2_math_cpu.py                 # the CPU demo
    torchrun --nproc_per_node 8 train.py --config configs/math_3agent.py # GPUs, FSDP2 + vLLM
    python train.py --config configs/X.py --algo.adv-estimator rloo --trainer.total-steps 10

One step reads top to bottom in `main`:
  rollout (episode driver + engine) -> rewards per turn -> old logprobs (or the sampling ones) ->
  reference logprobs with adapters off (only if KL is used) -> advantages per role, groups =
  (task, role[, turn]) across the num_chains episodes of a task -> for each trainable adapter:
  ppo_epochs x mini-batches x micro-batches, grad clip, its own AdamW step -> engine sync ->
  metrics -> greedy eval -> checkpoint.

Distributed (torchrun): each rank rolls out its share of the tasks (all chains of a task on one
rank, so groups are local), the model is FSDP2-sharded per decoder layer then at the root, the
loss is normalised by the global token count, metrics are reduced, and rank 0 logs and writes
checkpoints. Multi-node is torchrun's job (`--nnodes N --node-rank i --rdzv-endpoint host:port`).
Batch-whitened estimators (reinforce++, gae) whiten per rank.

Deliberately left out: sequence packing, Ulysses/context parallelism, async rollouts, a reward
model; the value head of GAE is a linear head on the shared base with its own "critic" adapter.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import lora
import ppo
from config import Config, load_config_file, to_dict
from data.math_data import load_math
from model import load_model
from rollout import Episode, RoleSpec, SamplingParams, Step, TorchEngine, merge_turns, run_episodes

RANK, WORLD = 0, 1


def print0(*a, **k):
    if RANK == 0:
        print(*a, **k, flush=True)


def make_env_factory(cfg: Config):
    """The workflows: a plain dict of (make_env, aggregate, load_tasks), no registry."""
    from envs import code_team, math_3agent, math_single, math_tool, react, search_team
    from rewards.code import load_code_tasks, load_humaneval
    d = cfg.data
    envs = {
        "math_3agent": (lambda: math_3agent.MathTeamEnv(d.max_refinement_iterations), math_3agent.aggregate, load_math),
        "math_single": (math_single.MathSingleEnv, math_single.aggregate, load_math),
        "math_tool": (lambda: math_tool.MathToolEnv(d.max_refinement_iterations), math_tool.aggregate, load_math),
        "code": (lambda: code_team.CodeTeamEnv(d.max_refinement_iterations), code_team.aggregate,
                 lambda spec: load_humaneval() if spec == "humaneval" else load_code_tasks(spec)),
        "search": (lambda: search_team.SearchTeamEnv(d.corpus, d.search_k, d.max_refinement_iterations),
                   search_team.aggregate, load_math),
        "react": (lambda: react.ToolAgentEnv(d.agent_style, d.tools, d.max_refinement_iterations), react.aggregate,
                  load_math),
    }
    return envs[d.env]


# --------------------------------------------------------------------------------------------
# distributed helpers (all no-ops in a single process)


def all_sum(x: float | list) -> float | list:
    if WORLD == 1:
        return x
    t = torch.tensor(x, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def all_max(x: int) -> int:
    if WORLD == 1:
        return x
    t = torch.tensor([x])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_objects(obj) -> list:
    if WORLD == 1:
        return [obj]
    out = [None] * WORLD
    dist.all_gather_object(out, obj)
    return out


# --------------------------------------------------------------------------------------------
# turning Steps into padded tensors; everything lives in "target space": column t predicts token t+1


class RoleBatch:
    """All turns of one adapter in this step, right-padded. Rows may include zero-weight dummies."""

    def __init__(self, steps: list[Step], temps: list[float], pad_id: int):
        self.steps = steps
        L = max(len(s.prompt_ids) + len(s.completion_ids) for s in steps)
        N = len(steps)
        self.ids = torch.full((N, L), pad_id, dtype=torch.long)
        self.attn = torch.zeros(N, L, dtype=torch.long)
        self.mask = torch.zeros(N, L - 1)  # 1 on targets the role generated
        self.sample_logp = torch.zeros(N, L - 1)
        self.last = torch.zeros(N, dtype=torch.long)  # target column of each row's last token
        for i, s in enumerate(steps):
            P, C = len(s.prompt_ids), len(s.completion_ids)
            if (s.logprobs and len(s.logprobs) != C) or P == 0:
                raise ValueError(f"step of episode {s.episode_id} turn {s.turn} ({s.role}): {P} prompt tokens, "
                                 f"{C} completion tokens but {len(s.logprobs)} logprobs")
            self.ids[i, :P + C] = torch.tensor(s.prompt_ids + s.completion_ids)
            self.attn[i, :P + C] = 1
            m = torch.tensor(s.info.get("loss_mask", [1] * C), dtype=torch.float)  # 0 on tool output
            self.mask[i, P - 1:P + C - 1] = m * float(not s.info.get("dummy", False))
            if s.logprobs:
                self.sample_logp[i, P - 1:P + C - 1] = torch.tensor(s.logprobs)
            self.last[i] = P + C - 2
        self.temps = torch.tensor(temps)
        self.rows_len = self.attn.sum(1)

    def micro(self, rows):
        """(ids, attn, slice of target columns) for a list of row indices, trimmed to their length."""
        L = int(self.rows_len[rows].max())
        return self.ids[rows, :L], self.attn[rows, :L], L - 1


def micro_chunks(rows: list[int], size: int) -> list[list[int]]:
    """Split rows into micro-batches; every rank runs the same number (FSDP collectives), padding
    with empty chunks that callers run as zero-weight dummies."""
    chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
    n = all_max(len(chunks))
    return chunks + [[] for _ in range(n - len(chunks))]


def forward_logp(model, rb: RoleBatch, rows, device, with_entropy=False, entropy_grad=False):
    ids, attn, T = rb.micro(rows)
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits[:, :-1]  # (b, T, V)
    logits = logits.float() / rb.temps[rows].to(device)[:, None, None]
    logp = ppo.token_logprobs(logits, ids[:, 1:].to(device))  # (b, T)
    ent = None
    if with_entropy:  # a metric always; differentiable only for the entropy bonus
        ent = ppo.entropy(logits if entropy_grad else logits.detach(), rb.mask[rows, :T].to(device))
    return logp, ent, T


def forward_values(model, value_head, rb: RoleBatch, rows, device):
    ids, attn, T = rb.micro(rows)
    out = model(input_ids=ids.to(device), attention_mask=attn.to(device), output_hidden_states=True, logits_to_keep=1)
    return value_head(out.hidden_states[-1][:, :-1].float()).squeeze(-1), T  # (b, T)


@torch.no_grad()
def batch_logp(model, rb: RoleBatch, adapter, cfg, device):
    """Logprobs of every row under `adapter` (None = the reference policy), in micro-batches."""
    lora.set_adapter(model, adapter)
    model.eval()  # no dropout when scoring
    out = torch.zeros_like(rb.sample_logp)
    for rows in micro_chunks(list(range(len(rb.steps))), cfg.algo.micro_batch_size):
        lp, _, T = forward_logp(model, rb, rows or [0], device)
        if rows:
            out[rows, :T] = lp.cpu()
    return out


# --------------------------------------------------------------------------------------------
# advantages


def compute_advantages(cfg: Config, rb: RoleBatch, old_logp, ref_logp, values, greedy_baseline, kl_coef):
    a = cfg.algo
    steps, mask = rb.steps, rb.mask
    scores = torch.tensor([s.reward for s in steps])
    gids = [(s.task_id, s.role, s.turn if a.group_by_turn else 0) if not s.info.get("dummy") else ("dummy", i)
            for i, s in enumerate(steps)]
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(steps)), rb.last] = scores
    kl_mean = 0.0
    if a.kl_coef > 0 and a.kl_in_reward:
        token_rewards, kl = ppo.kl_in_reward(token_rewards, old_logp, ref_logp, mask, kl_coef, a.kl_kind)
        kl_mean = float(kl)
    returns = None
    if a.adv_estimator == "grpo":
        adv = ppo.grpo_advantages(scores, gids, mask, a.norm_by_std)
    elif a.adv_estimator == "rloo":
        adv = ppo.rloo_advantages(scores, gids, mask)
    elif a.adv_estimator == "reinforce++_baseline":
        adv = ppo.reinforce_pp_baseline_advantages(scores, gids, mask)
    elif a.adv_estimator == "reinforce++":
        adv = ppo.reinforce_pp_advantages(token_rewards, mask, a.gamma)
    elif a.adv_estimator == "remax":
        adv = ppo.remax_advantages(token_rewards, greedy_baseline, mask)
    else:  # gae
        adv, returns = ppo.gae_advantages(token_rewards, values, mask, a.gamma, a.lam)
    keep = torch.ones(len(steps))
    if a.dynamic_sampling:  # DAPO: a group whose rewards are all equal teaches nothing
        _, std, n = ppo.group_stats(scores, gids)
        keep = ((std > 0) | (n == 1)).float() * (n > 1).float()
    return adv * keep[:, None], returns, keep, kl_mean


# --------------------------------------------------------------------------------------------
# one adapter's update


def policy_update(model, opt, sched, adapter, rb, adv, old_logp, ref_logp, cfg, device, kl_coef, gen):
    """ppo_epochs x mini-batches x micro-batches on one adapter. A non-finite loss or gradient skips
    that optimizer step (grads dropped, weights untouched) and is counted in `skipped`."""
    a = cfg.algo
    lora.set_adapter(model, adapter)
    model.train()
    params = lora.adapter_parameters(model, adapter)
    N = len(rb.steps)
    stats = defaultdict(list)
    skipped = 0
    n_mb = max(1, math.ceil(all_sum(float(N)) / a.mini_batch_size))
    for _ in range(a.ppo_epochs):
        perm = torch.randperm(N, generator=gen).tolist()
        for k in range(n_mb):
            mb = perm[k * N // n_mb:(k + 1) * N // n_mb]
            if a.loss_agg == "token-mean":
                denom = all_sum(float(rb.mask[mb].sum())) if mb else all_sum(0.0)
            else:
                denom = all_sum(float((rb.mask[mb].sum(1) > 0).sum())) if mb else all_sum(0.0)
            denom = max(denom, 1.0)
            bad = False
            for rows in micro_chunks(mb, a.micro_batch_size):
                w = 1.0 if rows else 0.0
                rows = rows or [0]
                logp, ent, T = forward_logp(model, rb, rows, device, with_entropy=True, entropy_grad=a.entropy_coef > 0)
                m = rb.mask[rows, :T].to(device) * w
                A, old = adv[rows, :T].to(device), old_logp[rows, :T].to(device)
                lossf = ppo.gspo_loss if a.policy_loss == "gspo" else ppo.policy_loss
                kw = {} if a.policy_loss == "gspo" else {"dual_clip": a.dual_clip}
                pg_loss, pm = lossf(logp, old, A, m, a.clip_low, a.clip_high, agg=a.loss_agg, denom=denom, **kw)
                loss = pg_loss
                if a.kl_coef > 0 and not a.kl_in_reward:
                    kl = ppo.agg_loss(ppo.kl_penalty(logp, ref_logp[rows, :T].to(device), a.kl_kind), m, a.loss_agg, denom)
                    loss = loss + kl_coef * kl
                    stats["kl_loss"].append(kl.item())
                if a.entropy_coef > 0:
                    loss = loss - a.entropy_coef * ppo.agg_loss(ent, m, a.loss_agg, denom)
                if w:
                    stats["entropy"].append(float(ppo.masked_mean(ent.detach(), m)))
                if not torch.isfinite(loss):
                    bad = True
                (loss * WORLD).backward()  # FSDP averages gradients over ranks; we want the sum
                if w:
                    for key in ("clipfrac", "clipfrac_high", "clipfrac_low", "approx_kl", "ratio_max"):
                        stats[key].append(pm[key])
            norm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
            norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            if bad or not math.isfinite(norm):
                skipped += 1
                opt.zero_grad(set_to_none=True)
                continue
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            stats["grad_norm"].append(norm)
    out = {k: float(np.mean(v)) for k, v in stats.items() if v}
    out["skipped"] = skipped
    return out


def critic_update(model, value_head, opt, rb, returns, old_values, cfg, device):
    a = cfg.algo
    lora.set_adapter(model, "critic")
    model.train()
    rows_all = list(range(len(rb.steps)))
    losses = []
    for _ in range(a.ppo_epochs):
        denom = max(all_sum(float(rb.mask.sum())), 1.0)
        for rows in micro_chunks(rows_all, a.micro_batch_size):
            w = 1.0 if rows else 0.0
            rows = rows or [0]
            v, T = forward_values(model, value_head, rb, rows, device)
            loss, m = ppo.value_loss(v, old_values[rows, :T].to(device), returns[rows, :T].to(device),
                                     rb.mask[rows, :T].to(device) * w, a.vf_clip, "token-mean", denom)
            (a.vf_coef * loss * WORLD).backward()
            losses.append(m["vf_loss"])
        params = lora.adapter_parameters(model, "critic") + list(value_head.parameters())
        if WORLD > 1:  # the value head is replicated, not sharded: average its gradients by hand
            for p in value_head.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        norm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if math.isfinite(norm):
            opt.step()
        opt.zero_grad(set_to_none=True)
    return {"vf_loss": float(np.mean(losses))}


# --------------------------------------------------------------------------------------------
# checkpoints: a temp dir renamed into place, so a crash mid-save leaves the previous one intact


def ckpt_dirs(out: Path) -> list[Path]:
    d = out / "checkpoints"
    return sorted([p for p in d.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")]) if d.exists() else []


def save_checkpoint(out: Path, step, cfg, model, opts, value_head, kl_ctrl, cursor, engine):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    final = out / "checkpoints" / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if RANK == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if WORLD > 1:
        dist.barrier()
    for name in cfg.adapters + (["critic"] if value_head is not None else []):
        lora.save_adapter(model, name, tmp / "adapters" / name, base_model_name_or_path=cfg.model.spec)
    opt_states = {n: get_optimizer_state_dict(model, o, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                  for n, o in opts.items() if n != "critic"}
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
           "engine": engine.state_dict() if hasattr(engine, "state_dict") else None}
    torch.save(rng, tmp / f"rng_rank{RANK}.pt")
    if RANK == 0:
        state = {"step": step, "cursor": cursor, "kl": kl_ctrl.state_dict(), "optim": opt_states,
                 "sched": {n: o.sched.state_dict() for n, o in opts.items()}}
        if value_head is not None:
            state["value_head"] = value_head.state_dict()
            state["critic_optim"] = opts["critic"].state_dict()
        torch.save(state, tmp / "trainer_state.pt")
        (tmp / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    if WORLD > 1:
        dist.barrier()
    if RANK == 0:
        os.replace(tmp, final)
        for old in ckpt_dirs(out)[:-cfg.trainer.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    if WORLD > 1:
        dist.barrier()


def resolve_resume(cfg: Config, out: Path) -> Path | None:
    r = cfg.trainer.resume
    if r == "none":
        return None
    if r == "auto":
        d = ckpt_dirs(out)
        return d[-1] if d else None
    p = Path(r)
    if not (p / "trainer_state.pt").exists():
        raise FileNotFoundError(f"trainer.resume={r}: not a complete checkpoint (no trainer_state.pt)")
    return p


# --------------------------------------------------------------------------------------------
# logging


class Logger:
    def __init__(self, cfg: Config, out: Path, resumed_step: int):
        self.path = out / "metrics.jsonl"
        self.wandb = None
        if RANK != 0:
            return
        if self.path.exists():  # a resumed run: drop lines past the checkpoint (a killed run's tail)
            keep = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= resumed_step]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        if "wandb" in cfg.trainer.logger:
            import wandb
            self.wandb = wandb.init(project=cfg.trainer.wandb_project, dir=str(out), config=to_dict(cfg),
                                    name=out.name, resume="allow")

    def log(self, step, metrics: dict, console: str | None = None):
        if RANK != 0:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if console:
            print(console, flush=True)

    def plot(self, out: Path, roles):
        if RANK != 0 or not self.path.exists():
            return
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = [json.loads(ln) for ln in self.path.read_text().splitlines() if ln]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, prefix in zip(axes, ("train", "val")):
            for r in roles:
                pts = [(x["step"], x[f"{prefix}/reward/{r}"]) for x in rows if f"{prefix}/reward/{r}" in x]
                if pts:
                    ax.plot(*zip(*pts), marker="o" if prefix == "val" else None, label=r)
            ax.set_title(f"{prefix} reward per role")
            ax.set_xlabel("step")
            if ax.get_lines():
                ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "rewards.png", dpi=100)
        plt.close(fig)


# --------------------------------------------------------------------------------------------
# rollouts and eval


def role_specs(cfg: Config, step_seed: int | None, greedy=False):
    r = cfg.rollout
    return {ro.name: RoleSpec(cfg.adapter_of(ro), SamplingParams(
        max_new_tokens=ro.max_tokens, temperature=ro.temperature, top_p=r.top_p, top_k=r.top_k, greedy=greedy,
        seed=step_seed)) for ro in cfg.roles}


def rollout(engine, tok, cfg, tasks, task_ids, roles, num_chains, progress):
    make_env = make_env_factory(cfg)[0]
    steps, eps = run_episodes(engine, tok, make_env, tasks, roles, num_chains=num_chains,
                              max_turns=cfg.rollout.max_turns, max_model_len=cfg.rollout.max_model_len,
                              progress=progress and RANK == 0, seed_ids=task_ids)
    for e in eps:  # global task ids, so groups and seeds do not depend on how tasks were split
        e.task_id = task_ids[e.task_id]
        for s in e.steps:
            s.task_id = e.task_id
    return steps, eps


def summarize(cfg, steps, eps, prefix):
    """Per-role mean reward and the env's per-agent metrics, reduced over ranks."""
    aggregate = make_env_factory(cfg)[1]
    sums = {r.name: [0.0, 0.0] for r in cfg.roles}
    for s in steps:
        sums[s.role][0] += s.reward
        sums[s.role][1] += 1
    flat = all_sum([v for r in cfg.roles for v in sums[r.name]])
    out = {}
    for i, r in enumerate(cfg.roles):
        if flat[2 * i + 1]:
            out[f"{prefix}/reward/{r.name}"] = flat[2 * i] / flat[2 * i + 1]
    light = [(e.metrics, [(s.role, len(s.completion_ids)) for s in e.steps]) for e in eps]
    every = [x for part in gather_objects(light) for x in part]
    rebuilt = [Episode(0, 0, None, [Step(0, 0, r, 0, [], [0] * n, []) for r, n in st], m) for m, st in every]
    out.update({f"{prefix}/{k}": v for k, v in aggregate(rebuilt).items()})
    out[f"{prefix}/team_reward"] = float(np.mean([m.get("team_reward", 0.0) for m, _ in every])) if every else 0.0
    return out


def evaluate(engine, tok, cfg, val_tasks):
    mine = list(range(RANK, len(val_tasks), WORLD))
    steps, eps = rollout(engine, tok, cfg, [val_tasks[i] for i in mine], mine, role_specs(cfg, None, greedy=True), 1,
                         progress=False)
    return summarize(cfg, steps, eps, "val")


# --------------------------------------------------------------------------------------------


def main(cfg: Config):
    global RANK, WORLD
    cfg.validate()
    # --- init: distributed, seeds, model, adapters, engine, data --------------------------------
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        RANK, WORLD = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    t_cfg = cfg.trainer
    out = Path(t_cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(t_cfg.seed)
    np.random.seed(t_cfg.seed)
    torch.manual_seed(t_cfg.seed)

    model, tok = load_model(cfg.model.spec, cfg.model.dtype, device, seed=t_cfg.seed)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    L = cfg.lora
    lora.add_lora(model, cfg.adapters, L.rank, L.alpha, L.dropout, L.targets, seed=t_cfg.seed)
    value_head = None
    if cfg.algo.adv_estimator == "gae":
        lora.add_lora(model, ["critic"], L.rank, L.alpha, L.dropout, L.targets, seed=t_cfg.seed + 1)
        value_head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(value_head.weight)
        torch.nn.init.zeros_(value_head.bias)

    ckpt = resolve_resume(cfg, out)
    state = None
    if ckpt is not None:  # adapters are loaded into the plain model, before sharding
        for name in cfg.adapters + (["critic"] if value_head is not None else []):
            lora.load_adapter(model, name, ckpt / "adapters" / name)
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        if value_head is not None:
            value_head.load_state_dict(state["value_head"])
        print0(f"resumed from {ckpt} (step {state['step']})")

    if WORLD > 1:
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)

    opts = {}
    for name in cfg.trainable_adapters:
        o = torch.optim.AdamW(lora.adapter_parameters(model, name), lr=cfg.algo.lr, weight_decay=cfg.algo.weight_decay)
        w = cfg.algo.warmup_steps
        o.sched = torch.optim.lr_scheduler.LambdaLR(o, lambda s, w=w: min(1.0, (s + 1) / w) if w else 1.0)
        opts[name] = o
    if value_head is not None:
        o = torch.optim.AdamW(lora.adapter_parameters(model, "critic") + list(value_head.parameters()), lr=cfg.algo.critic_lr)
        o.sched = torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0)
        opts["critic"] = o
    a = cfg.algo
    kl_ctrl = ppo.AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_adaptive else ppo.FixedKLController(a.kl_coef)

    if cfg.rollout.engine == "vllm":
        from rollout import VLLMEngine
        engine = VLLMEngine(model, tok, adapters=cfg.adapters, max_model_len=cfg.rollout.max_model_len, seed=t_cfg.seed,
                            gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization)
    else:
        engine = TorchEngine(model, tok, max_batch_size=cfg.rollout.max_batch_size, seed=t_cfg.seed)

    load_tasks = make_env_factory(cfg)[2]

    def tasks_of(files):
        ts = load_tasks(files)
        if cfg.data.levels is not None:
            ts = [x for x in ts if x.get("level") in cfg.data.levels]
            if not ts:
                raise ValueError(f"config field data.levels={cfg.data.levels}: no task of {files} has such a level")
        return ts
    train_tasks = tasks_of(cfg.data.train_files)
    val_tasks = tasks_of(cfg.data.val_files)[:cfg.data.val_size]
    steps_per_epoch = max(1, len(train_tasks) // cfg.data.batch_size)
    total = t_cfg.total_epochs * steps_per_epoch if t_cfg.total_epochs else t_cfg.total_steps
    start, cursor = 0, 0  # cursor: index of the next task in the seeded epoch permutation stream

    if state is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        start, cursor = state["step"], state["cursor"]
        for n, o in opts.items():
            if n == "critic":
                o.load_state_dict(state["critic_optim"])
            else:
                set_optimizer_state_dict(model, o, optim_state_dict=state["optim"][n],
                                         options=StateDictOptions(full_state_dict=True))
            o.sched.load_state_dict(state["sched"][n])
        kl_ctrl.load_state_dict(state["kl"])
        rng = torch.load(ckpt / f"rng_rank{RANK}.pt", weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng["engine"] is not None and hasattr(engine, "load_state_dict"):
            engine.load_state_dict(rng["engine"])
    logger = Logger(cfg, out, start)
    role_temp = {r.name: r.temperature for r in cfg.roles}
    old_from_sampling = a.recompute_old_logprobs == "never" or (
        a.recompute_old_logprobs == "auto" and cfg.rollout.engine == "torch" and cfg.model.dtype in ("float32", "fp32")
        and cfg.rollout.top_p == 1.0 and cfg.rollout.top_k == 0 and not cfg.model.gradient_checkpointing)

    if t_cfg.eval_only or (t_cfg.val_before_train and start == 0):
        metrics = evaluate(engine, tok, cfg, val_tasks)
        logger.log(start, metrics, f"[eval step {start}] " + fmt(metrics, "val"))
        if t_cfg.eval_only:
            return finish(metrics)

    # --- the loop -----------------------------------------------------------------------------
    metrics = {}
    for step in range(start + 1, total + 1):
        t0 = time.perf_counter()
        # tasks of this step: a seeded permutation per epoch; this rank takes every WORLD-th task
        ids = []
        while len(ids) < cfg.data.batch_size:
            epoch, pos = divmod(cursor, len(train_tasks))
            perm = np.random.RandomState(t_cfg.seed + epoch).permutation(len(train_tasks))
            ids.append(int(perm[pos]))
            cursor += 1
        gids = list(range((step - 1) * cfg.data.batch_size, step * cfg.data.batch_size))  # global task ids
        mine = [i for i in range(len(ids)) if i % WORLD == RANK]
        step_seed = (t_cfg.seed * 1_000_003 + step * 7_919) % (2**31)
        steps, eps = rollout(engine, tok, cfg, [train_tasks[ids[i]] for i in mine], [gids[i] for i in mine],
                             role_specs(cfg, step_seed), cfg.rollout.num_chains, cfg.rollout.progress)
        n_tokens = all_sum(float(sum(len(s.completion_ids) for s in steps)))
        t_roll = time.perf_counter() - t0
        if cfg.rollout.merge_turns:
            steps = merge_turns(steps)

        greedy_scores = {}
        if a.adv_estimator == "remax":  # ReMax's baseline: one greedy episode per task
            gsteps, _ = rollout(engine, tok, cfg, [train_tasks[ids[i]] for i in mine], [gids[i] for i in mine],
                                role_specs(cfg, None, greedy=True), 1, False)
            for s in gsteps:
                greedy_scores.setdefault((s.task_id, s.role), []).append(s.reward)

        # --- per adapter: scores -> old / ref logprobs -> advantages -> update ----------------
        t1 = time.perf_counter()
        metrics = summarize(cfg, steps, eps, "train")
        kl_vals = []
        by_adapter = defaultdict(list)
        for s in steps:
            by_adapter[cfg.adapter_of(next(r for r in cfg.roles if r.name == s.role))].append(s)
        critic_warm = value_head is not None and step <= a.critic_warmup_steps
        for adapter in cfg.adapters:
            mine_steps = by_adapter.get(adapter, [])
            present = all_sum(float(len(mine_steps)))
            if present == 0:
                continue
            if not mine_steps:  # this rank has no turn of this adapter: a zero-weight dummy keeps collectives in step
                mine_steps = [Step(-1, -1, next(r.name for r in cfg.roles if cfg.adapter_of(r) == adapter), 0,
                                   [tok.pad_token_id], [tok.pad_token_id], [0.0], info={"dummy": True})]
            rb = RoleBatch(mine_steps, [role_temp[s.role] for s in mine_steps], tok.pad_token_id)
            trainable = adapter in opts
            old_logp = rb.sample_logp if old_from_sampling else batch_logp(model, rb, adapter, cfg, device)
            if not old_from_sampling:
                gap = float((old_logp - rb.sample_logp).abs().mul(rb.mask).sum() / rb.mask.sum().clamp(min=1))
                metrics[f"train/logprob_gap/{adapter}"] = gap
            ref_logp = batch_logp(model, rb, None, cfg, device) if a.kl_coef > 0 else None
            values = None
            if value_head is not None:
                lora.set_adapter(model, "critic")
                model.eval()
                values = torch.zeros_like(rb.mask)
                with torch.no_grad():
                    for rows in micro_chunks(list(range(len(rb.steps))), a.micro_batch_size):
                        v, T = forward_values(model, value_head, rb, rows or [0], device)
                        if rows:
                            values[rows, :T] = v.float().cpu()
            baseline = torch.tensor([float(np.mean(greedy_scores.get((s.task_id, s.role), [0.0]))) for s in rb.steps])
            adv, returns, keep, kl_r = compute_advantages(cfg, rb, old_logp, ref_logp, values, baseline, kl_ctrl.value)
            if ref_logp is not None:
                kl_vals.append(float(ppo.masked_mean(ppo.kl_penalty(old_logp, ref_logp, a.kl_kind), rb.mask)))
            metrics[f"train/kept_frac/{adapter}"] = float(keep.mean()) if a.dynamic_sampling else 1.0
            if value_head is not None:
                metrics.update({f"train/{k}": v for k, v in critic_update(model, value_head, opts["critic"], rb, returns,
                                                                          values, cfg, device).items()})
            if trainable and not critic_warm:
                gen = torch.Generator().manual_seed(step_seed + zlib.crc32(adapter.encode()) % 1000)  # str hash() is salted
                um = policy_update(model, opts[adapter], opts[adapter].sched, adapter, rb, adv, old_logp, ref_logp,
                                   cfg, device, kl_ctrl.value, gen)
                metrics.update({f"train/{k}/{adapter}": v for k, v in um.items()})
        lora.set_adapter(model, None)
        model.eval()
        if kl_vals:
            metrics["train/kl"] = float(np.mean(kl_vals))
            kl_ctrl.update(metrics["train/kl"], cfg.data.batch_size * cfg.rollout.num_chains)
        metrics["train/kl_coef"] = kl_ctrl.value
        t_train = time.perf_counter() - t1

        # --- sync the engine, log -------------------------------------------------------------
        t2 = time.perf_counter()
        engine.sync()
        t_sync = time.perf_counter() - t2
        dt = time.perf_counter() - t0
        metrics.update({"time/rollout": t_roll, "time/train": t_train, "time/sync": t_sync, "time/step": dt,
                        "perf/tokens_per_s": n_tokens / max(t_roll, 1e-9), "train/epoch": cursor / len(train_tasks)})
        logger.log(step, metrics, f"[step {step}/{total}] " + fmt(metrics, "train") +
                   f" | {n_tokens / max(t_roll, 1e-9):.0f} tok/s | roll {t_roll:.1f}s train {t_train:.1f}s sync {t_sync:.2f}s")

        # --- eval, then checkpoint (a checkpoint implies every line of its step is logged) -----
        if t_cfg.test_freq and (step % t_cfg.test_freq == 0 or step == total):
            vm = evaluate(engine, tok, cfg, val_tasks)
            metrics.update(vm)
            logger.log(step, vm, f"[eval step {step}] " + fmt(vm, "val"))
        if (t_cfg.save_freq and step % t_cfg.save_freq == 0) or step == total:
            save_checkpoint(out, step, cfg, model, opts, value_head, kl_ctrl, cursor, engine)
    logger.plot(out, [r.name for r in cfg.roles])
    return finish(metrics)


def fmt(m: dict, prefix: str) -> str:
    parts = [f"{k.split('/')[-1]} {v:.3f}" for k, v in m.items() if k.startswith(f"{prefix}/reward/")]
    for k in ("team_reward", "final_acc", "kl"):
        if f"{prefix}/{k}" in m:
            parts.append(f"{k} {m[f'{prefix}/{k}']:.3f}")
    for key in ("clipfrac", "entropy"):
        vals = [v for k, v in m.items() if k.startswith(f"{prefix}/{key}/")]
        if vals:
            parts.append(f"{key} {np.mean(vals):.3f}")
    skipped = sum(v for k, v in m.items() if k.startswith(f"{prefix}/skipped/"))
    if skipped:
        parts.append(f"SKIPPED {int(skipped)} non-finite steps")
    return " ".join(parts)


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
    """`--config file.py` (optional) then tyro overrides on top of it."""
    import tyro
    argv = list(sys.argv[1:] if argv is None else argv)
    base = Config()
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise SystemExit("--config needs a path")
        base = load_config_file(argv[i + 1])
        del argv[i:i + 2]
    return tyro.cli(Config, default=base, args=argv, description=__doc__.split("\n")[0])


if __name__ == "__main__":
    main(cli())
    if WORLD > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

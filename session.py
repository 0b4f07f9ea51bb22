"""A run's live objects and what every entry point does with them (train.py, eval.py, play.py share
these, never each other's internals): build the model, adapters, optimizers and engine from a
config (resuming from a checkpoint); roll out a config's episodes on this rank's tasks with global
task ids; summarize them into metrics (+ how far the adapters moved apart); write them as
trajectory files; finish a run.
"""
from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

import collectives
import lora
import ppo
import trajectories
from collectives import gather_objects, rank
from config import Config, ConfigError
from critic import Critic
from learner import AdapterBatch, adapter_divergence
from model import load_model
from rollout import Episode, RoleSpec, SamplingParams, Sample, TorchEngine, run_episodes
from rundir import load_adapters, load_checkpoint
from workflows import workflow


class Run:
    """The live objects of a run and the counters a checkpoint restores."""

    def __init__(self, cfg, model, tok, device):
        self.cfg, self.model, self.tok, self.device = cfg, model, tok, device
        self.step, self.cursor, self.wandb_id = 0, 0, None  # cursor: next position in the task stream
        self.opts, self.scheds, self.critic, self.engine = {}, {}, None, None
        self.warned: set = set()  # one-time warnings already printed
        self.idle: dict[str, int] = {}  # role -> training steps in a row it learned nothing (train.report_idle)
        self.refs: dict[str, str] = {}  # adapter -> the frozen adapter its KL is measured to (algo.kl_ref init)
        # estimators with state (ppo.StatefulEstimator): one instance per adapter, checkpointed
        est = {x: cfg.estimator_of(cfg.role_of_adapter(x)) for x in cfg.adapters}
        self.estimator_state = {x: ppo.ADVANTAGES[e](**cfg.algo.estimator_kwargs) for x, e in est.items()
                                if isinstance(ppo.ADVANTAGES.get(e), type)}
        a = cfg.algo
        self.kl_ctrl = (ppo.AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_adaptive
                        else ppo.FixedKLController(a.kl_coef))
        self.old_from_sampling = a.recompute_old_logprobs == "never" or (
            a.recompute_old_logprobs == "auto" and a.rollout_is != "on" and cfg.rollout.engine == "torch"
            and cfg.model.dtype in ("float32", "fp32")
            and cfg.rollout.top_p == 1.0 and cfg.rollout.top_k == 0 and not cfg.model.gradient_checkpointing)

    def describe(self) -> str:
        """One line: the model, each adapter's trainable parameters (frozen, or where it starts from), the engine."""
        cfg = self.cfg
        n_base = sum(p.numel() for n, p in self.model.named_parameters() if ".lora_" not in n)
        inits = {cfg.adapter_of(r): r.init_from for r in cfg.roles if r.init_from}
        per = {n: sum(p.numel() for p in lora.adapter_parameters(self.model, n)) for n in cfg.adapters}
        return (f"model {cfg.model.spec} ({n_base / 1e6:.1f}M params, {cfg.model.dtype}) | adapters (trainable params): "
                + ", ".join(f"{n} {v / 1e6:.2f}M" + ("" if n in self.opts else " frozen")
                            + (f" from {inits[n]}" if n in inits and self.step == 0 else "") for n, v in per.items())
                + f" | engine {cfg.rollout.engine} | {collectives.world()} rank(s)"
                + ((", FSDP2" if collectives.sharded(self.model) else ", replicated")
                   if torch.distributed.is_initialized() else "")  # what the model is, not what the config asked
                + (f", {torch.get_num_threads()} torch thread(s)" if self.device.type == "cpu" else ""))


def busy_cores(interval: float = 0.25) -> float | None:
    """How many cores are busy now: the non-idle share of all CPU time in /proc/stat over `interval` seconds,
    times the CPUs; None where there is no /proc/stat. Unlike the 1-minute load average it does not still count
    a job that ended a moment ago (a recipe's previous stage: on an idle machine its RL stage took 1 thread)."""
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)  # all, idle + iowait
    try:
        t0, i0 = read()
        time.sleep(interval)
        t1, i1 = read()
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, 1 - (i1 - i0) / max(1, t1 - t0)) * (os.cpu_count() or 1)


def pick_threads(requested: int) -> tuple[int, str | None]:
    """(torch threads, a note when the machine looks oversubscribed). requested 0 = auto: OMP_NUM_THREADS
    when set (plain ASCII digits; anything else is ignored), else the cores left free by what is busy now
    (busy_cores; the 1-minute load average where /proc/stat is missing), at least 1. An explicit count is
    kept and named when the load average says the machine is busy. Never more than the cores:
    torch.set_num_threads(99999) ends in SIGSEGV."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    digits = env.lstrip("0") if env.isascii() and env.isdigit() else ""  # "²".isdigit() is True
    # past 9 digits: more threads than any machine has cores (and int() refuses 4301 digits: a ValueError)
    from_env = 0 if not digits else int(digits) if len(digits) < 10 else cores
    now = None if requested or from_env else busy_cores()
    load = now if now is not None else os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    n = min(cores, requested or from_env or max(1, round(cores - load)))
    busy = load + n > cores + 0.5
    what = f"{load:.1f} of {cores} cores busy" if now is not None else f"load average {load:.1f} on {cores} cores"
    return n, (f"note: this machine looks busy ({what}) and torch will use {n} thread(s): expect slow steps; more "
               f"threads than free cores made CPU runs 3-30x slower (docs/benchmarks.md \"Threads\"; set "
               f"--trainer.threads)" if busy else None)


def check_targets(cfg: Config, model):
    """Every LoRA target a role asks for names a linear layer of this model: knowable only once it has
    loaded, so this runs right after, before any adapter is added (lora.add_lora skips unknown names)."""
    have = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, lora.LoRALinear))}
    for i, r in enumerate(cfg.roles):
        unknown = sorted(set(cfg.lora_of(r)[2]) - have)
        if unknown:
            field = f"roles[{i}].targets" if r.targets is not None else "lora.targets"
            raise ConfigError(f"config field {field}: {cfg.model.spec} has no linear layer named {unknown}; "
                              f"it has {sorted(have)}")


def load_init_from(model, cfg: Config, inits: dict):
    """Each adapter -> its role's init_from (sft.py's output, say): its own rank and alpha, and no dropout (a policy
    adapter never drops out). One that does not load is a ConfigError naming the role and the file, before any step
    or log line."""
    for name, path in inits.items():
        try:
            lora.load_adapter(model, name, path)
        except (ValueError, OSError) as e:  # torn, foreign, NaN
            raise ConfigError(f"config field init_from of {', '.join(r.name for r in cfg.roles if r.init_from == path)}:"
                              f" {e}") from None
        for m in lora.lora_modules(model).values():
            m.dropout_p[name] = 0.0
        model._lora_config[name]["lora_dropout"] = 0.0


def build(cfg: Config, ckpt: Path | None, train: bool = True):
    """Model, adapters (restored from `ckpt` if resuming), sharding, optimizers, engine. train=False (eval.py,
    play.py): nothing only the update uses (algo.kl_ref's frozen copies)."""
    device = collectives.init()
    if device.type == "cpu":
        n, note = pick_threads(cfg.trainer.threads)
        torch.set_num_threads(n)
        if note:
            collectives.print0(note)
    t_cfg, a = cfg.trainer, cfg.algo
    out = Path(t_cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(t_cfg.seed)
    np.random.seed(t_cfg.seed)
    torch.manual_seed(t_cfg.seed)
    model, tok = load_model(cfg.model.spec, cfg.model.dtype, device, seed=t_cfg.seed)
    check_targets(cfg, model)
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
    for (r, alpha, targets), names in fresh.items():
        lora.add_lora(model, names, r, alpha, 0.0, targets, seed=t_cfg.seed)
    load_init_from(model, cfg, inits)
    run = Run(cfg, model, tok, device)
    run.critic = Critic(model, cfg, device) if "gae" in cfg.estimators else None
    if train and not t_cfg.eval_only and a.kl_coef > 0 and a.kl_ref == "init":  # the reference: a frozen copy of
        for name, path in inits.items():  # each trained adapter's start (its init_from)
            if name not in cfg.trainable_adapters:
                continue
            run.refs[name] = f"{name}@init"  # '@' is no adapter name's (config.check_name): no clash
            lora.load_adapter(model, run.refs[name], path)
            lora.freeze_adapter(model, run.refs[name])
    if ckpt is not None:  # adapters go into the plain model, before sharding
        load_adapters(model, ckpt, cfg.adapters + (["critic"] if run.critic else []))
    collectives.shard(model, cfg.trainer.strategy)  # FSDP2 (or replicated) under torchrun
    for name in cfg.trainable_adapters:
        run.opts[name] = torch.optim.AdamW(lora.adapter_parameters(model, name), lr=cfg.lr_of(cfg.role_of_adapter(name)),
                                           weight_decay=a.weight_decay)
        run.scheds[name] = torch.optim.lr_scheduler.LambdaLR(
            run.opts[name], lambda s: min(1.0, (s + 1) / a.warmup_steps) if a.warmup_steps else 1.0)
    if run.critic:
        run.critic.make_optimizer(model)
    if cfg.rollout.engine == "vllm":
        from vllm_engine import VLLMEngine
        run.engine = VLLMEngine(model, tok, adapters=cfg.adapters, max_model_len=cfg.rollout.max_model_len,
                                seed=t_cfg.seed, gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
                                sleep=cfg.rollout.vllm_sleep)
    else:
        run.engine = TorchEngine(model, tok, max_batch_size=cfg.rollout.max_batch_size, seed=t_cfg.seed,
                                 compile=cfg.rollout.compile, fuse=cfg.rollout.fuse,
                                 prefix_cache_tokens=cfg.rollout.prefix_cache_tokens)
    if ckpt is not None:
        load_checkpoint(run, ckpt)
    return run, out


# --------------------------------------------------------------------------------------------
# episodes of a config, their metrics and files


def role_specs(cfg: Config, step_seed: int | None, greedy=False) -> dict[str, RoleSpec]:
    r = cfg.rollout
    return {ro.name: RoleSpec(cfg.adapter_of(ro), SamplingParams(
        max_new_tokens=ro.max_tokens, temperature=ro.temperature, top_p=r.top_p, top_k=r.top_k, greedy=greedy,
        seed=step_seed)) for ro in cfg.roles}


def episodes(engine, tok, cfg, tasks, task_ids, roles, num_chains, progress=False, baseline_roles=None, tree=False):
    """run_episodes on this rank's tasks, with global task ids (groups and seeds do not depend on
    how tasks were split over ranks); tree: rollout.tree_sampling's shared-state chains (training only)."""
    samples, episodes = run_episodes(engine, tok, workflow(cfg)[0], tasks, roles, num_chains=num_chains,
                                   max_turns=cfg.rollout.max_turns, max_model_len=cfg.rollout.max_model_len,
                                   progress=progress and rank() == 0, seed_ids=task_ids, baseline_roles=baseline_roles,
                                   tree=tree)
    for e in episodes:
        e.task_id = task_ids[e.task_id]
        for s in e.samples:
            s.task_id = e.task_id
    return samples, episodes


def summarize(cfg: Config, samples: list[Sample], episodes, prefix: str) -> dict:
    """Per-role reward (mean, std, min, max) and response length, the mean of every episode metric,
    and the workflow's own aggregate; reduced over ranks."""
    out = {}
    every = [x for part in gather_objects([(e.metrics, [(s.role, s.info.get("own_reward", s.reward), len(s.completion_ids))
                                                          for s in e.samples],
                                            e.truncated) for e in episodes]) for x in part]
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
        light = [Episode(0, 0, None, [Sample(0, 0, role, 0, [], [0] * n, [], reward=w) for role, w, n in st], m)
                 for m, st, _ in every]
        out.update({f"{prefix}/{k}": v for k, v in env_module.aggregate(light).items()})
    return out


def eval_metrics(run, samples: list[Sample], episodes, prefix: str) -> dict:
    """summarize(), plus how far the adapters have moved apart (and from the base): adapter_kl/a~b on
    the same turns (the first trainer.adapter_kl_turns) for every adapter."""
    metrics = summarize(run.cfg, samples, episodes, prefix)
    n = run.cfg.trainer.adapter_kl_turns
    if n == 0:
        return metrics
    sample = samples[:n] or [Sample(-1, -1, run.cfg.roles[0].name, 0, [run.tok.pad_token_id], [run.tok.pad_token_id],
                                 [0.0], dummy=True)]
    batch = AdapterBatch(sample, [1.0] * len(sample), run.tok.pad_token_id, 1)
    div = adapter_divergence(run.model, batch, list(run.cfg.adapters) + [None], run.device, run.cfg.algo.micro_batch_size)
    metrics.update({f"{prefix}/adapter_kl/{k}": v for k, v in div.items()})
    return metrics


def save_trajectories(run, episodes, path: Path, split: str, fraction: float) -> list[dict]:
    """Every 1/fraction-th episode of every rank, as records (trajectories.py), written by rank 0."""
    every = max(1, round(1 / fraction)) if fraction > 0 else 0
    mine = [trajectories.episode_record(e, run.tok, split, run.step) for e in episodes if every and e.episode_id % every == 0]
    records = sorted((r for part in gather_objects(mine) for r in part), key=lambda r: (r["task_id"], r["episode_id"]))
    if rank() == 0 and records:
        trajectories.write(path, records)
    return records


def finish(metrics):
    """End a run. Distributed runs synchronise once more, so every rank has finished its
    collectives and files, then `__main__` leaves with os._exit(0): with torch 2.13 + gloo a rank
    was seen to SIGABRT inside destroy_process_group() after correct results (1 run in ~10), and
    tearing the group down buys nothing at process exit."""
    collectives.barrier()
    if rank() == 0:
        try:
            import wandb
            if wandb.run is not None:
                wandb.finish()
        except ImportError:
            pass
    return metrics

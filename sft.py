"""Supervised fine-tuning of each role's LoRA adapter from trajectory files, the policy's own best
rollouts, and a programmatic teacher. The adapters it writes are what train.py starts from.

    python sft.py --data 'runs/X/trajectories/train_*.jsonl' --train-config configs/math_3agent.py --out runs/X_sft
    python sft.py --data 'strong_run/*.jsonl' --model smollm2-135m-instruct --roles solver --min-reward 0.7
    python sft.py --train-config configs/tiny_math_3agent.py --teacher math --data 'runs/tiny/trajectories/*.jsonl'
    python sft.py --train-config configs/tiny_math_3agent.py --rejection-k 4 --rejection-tasks 64   # best of 4
    python sft.py --train-config configs/video_qa.py --teacher scripted --teacher-tasks 200   # a perfect team's turns
    python sft.py --config configs/sft/tiny_math.py          # an SFTConfig in a file (CLI flags override it)
then RL from there: each role's `init_from` (config.RoleConfig) = <out>/<adapter>.

The pipeline, as this file reads top to bottom:
  1. sources -> episode records in the unified trajectory format (trajectories.py):
       - trajectory files (`data`: globs or directories): train.py's and eval.py's, or any run of a
         stronger model elsewhere written in the same format;
       - the current policy's own rollouts (`rejection_k` = k): the train config's training tasks
         (the first `rejection_tasks`) are rolled out k times each with the adapters SFT starts from
         (`init_from`, else fresh = the base model) and the best episode per task is kept: the
         highest team_reward (else mean recorded reward), ties broken by the mean weighted reward.
         All k are written to rejection.jsonl (and the teacher draws own samples from all of them).
  2. filter: a turn is kept when its reward >= `min_reward`; the reward is the weighted one of
     rewards/calculator.py (`reward=weighted`, the default; with the default weights a turn that
     failed its job scores at most 0.6) or the env's recorded one (`reward=recorded`). Replies cut
     at their token budget (finish_reason "length") are never kept: SFT would teach running out.
  3. examples: the prompt EXACTLY as the role saw it (the chat-formatted text the trajectory
     records, re-tokenised) -> the reply, plus EOS when the turn stopped on its own. The loss is on
     the reply tokens only.
  4. teacher (sft_teachers.py; `teacher=math`, the math team, where the truth is known): evaluator_critique examples,
     balanced, one critique of a correct and one of an incorrect solution per task, each with the
     right verdict (and the true answer, so the critique is calibrated). Correct solutions: the
     model's own right samples from the trajectories first, else a short synthetic one. Incorrect
     solutions: the model's OWN WRONG SAMPLES from the trajectories first (real mistakes, shown
     with the very prompt the evaluator saw); only for tasks without one, a perturbed answer
     supplements them: a correct solution whose final \\boxed{} answer is changed to a nearby wrong
     number (checked wrong with math_reward). A task that yields no incorrect solution gives no pair.
     `teacher=scripted` (any workflow whose module defines `scripted_replies(task)`: the video-QA
     team): a scripted perfect team's replies are played through a fresh env on the train config's
     training tasks; every turn the env asks for becomes an example (the chat-formatted prompt the
     role saw -> the scripted reply) when its env reward >= min_reward. A workflow that also defines
     `scripted_repair(task)` (the code team, the math team with derived verdicts) has a second episode
     played per task, [a near miss, the fix]: the roles a perfect team never calls (the refiner) get
     examples; the near miss is never one.
  5. train (sft_train.py), one adapter after another on one shared base: AdamW on that adapter's parameters only
     (every other adapter and the base stay bit-exact), micro-batches of `micro_batch_size`,
     `grad_accum` of them per optimizer step, the loss the token mean over the optimizer step's
     reply tokens (so it does not depend on how rows are split), grad clipping, linear warm-up.
     `pack_turns`: an adapter's turns of one conversation share one sequence, every reply in the loss.
     A held-out split (`val_frac`) is evaluated before, every `eval_every` steps and after: the eval
     hook (run_sft's `eval_hook(model, adapter, step) -> dict` adds your own numbers to those rows).
     Per-role LoRA settings (`role_lora`): rank, alpha, dropout and targets may differ per role;
     roles with other targets train on their own copy of the base (lora.py puts every adapter of
     one model on the same modules). train.py's init_from needs targets == its lora.targets.
  6. write: <out>/<adapter>/ (PEFT: adapter_config.json + adapter_model.safetensors, lora.save_adapter),
     <out>/sft_loss.jsonl + sft_loss.png (train loss per step, held-out loss), <out>/examples/<adapter>.jsonl
     (what each adapter was trained on), <out>/summary.json (counts per role, losses, and the fingerprint of
     what the SFT depended on: its options, the train config's relevant parts, the base model, the data,
     the task file, init_from adapters). The log is written as sft_loss.jsonl.tmp and summary.json last,
     each renamed into place: summary.json means finished. A rerun into the same <out> with the same
     fingerprint is not run again; one with another is refused (one line naming what differs), so a
     finished SFT is never overwritten by a different one or truncated by a rerun that fails. One SFT at
     a time in an <out> (rundir.DirLock): a second is refused with one line naming the first.
  Every option, and every adapter name (names become directories: [A-Za-z0-9_-], 'critic' reserved;
  a role name in a trajectory file counts), is checked before anything is written.

Deliberately left out: packing unrelated sequences into one row, full fine-tuning, preference losses (DPO), multi-GPU.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: docs/benchmarks.md "Threads"

import contextlib
import copy
import dataclasses
import hashlib
import importlib.util
import json
import math
import random
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

import lora
import trajectories
from config import MAX_LR, MAX_SEED, check_name
from model import load_model
from rewards.calculator import RewardCalculator, TrajectoryError, load_records
from sft_teachers import (  # noqa: F401 (re-exported: sft.math_teacher, sft.Example, ... keep working)
    GENERATORS,
    Example,
    math_teacher,
    perturb,
    scripted_teacher,
    teacher_critique,
    tokenize,
)
from sft_train import (  # noqa: F401 (step 5, re-exported: sft.train_adapter, sft.pack_conversations, ...)
    loss_sum,
    mean_loss,
    pack_conversations,
    plot,
    steps_of,
    train_adapter,
)


@dataclass
class SFTConfig:
    data: tuple[str, ...] = ()
    """trajectory files: globs (quote them) or directories of *.jsonl in the unified format (trajectories.py)"""
    train_config: str | None = None
    """a train.py config (configs/*.py, or a run's config.json): model, roles (adapter names; max_tokens =
    token budgets), LoRA defaults, seed, and the workflow and tasks the teacher and rejection sampling use"""
    model: str = "tiny"
    """base model when there is no train_config: a preset, a .gguf file, a local directory or a hub id"""
    dtype: str = "float32"
    """base weights dtype when there is no train_config (adapters are always fp32)"""
    roles: tuple[str, ...] = ()
    """roles to train; empty = every role of the train config, else every role in the data (+ the teacher's)"""
    min_reward: float = 0.7
    """keep turns whose reward >= this"""
    reward: Literal["weighted", "recorded"] = "weighted"
    """what min_reward reads: rewards/calculator.py's weighted reward, or the env's recorded reward"""
    weights: dict[str, float] = field(default_factory=dict)
    """calculator weights, e.g. completion 0.5 (unnamed: completion 0.4, efficiency 0.2, quality 0.3, reasoning 0.1)"""
    teacher: Literal["none", "math", "scripted"] = "none"
    """math: balanced evaluator_critique examples (critiques of correct and incorrect solutions, right verdicts);
    scripted: every role's turns of a scripted perfect team (the workflow module's scripted_replies(task))"""
    teacher_tasks: int = 0
    """tasks the teacher makes pairs for (0 = all: the trajectories' tasks, then the train config's); scripted:
    the first N of the train config's training tasks (0 = all)"""
    rejection_k: int = 0
    """rejection sampling: roll out the current policy k times per training task, keep the best (0 = off)"""
    rejection_tasks: int = 0
    """the first N training tasks for rejection sampling (0 = all)"""
    init_from: tuple[str, ...] = ()
    """'adapter=DIR': start that adapter from a saved PEFT adapter (the current policy, e.g. a checkpoint's
    adapters/<name>); the train config's roles' init_from count too"""
    rank: int | None = None
    """LoRA rank of new adapters (None: the train config's lora.rank, else 64)"""
    alpha: float | None = None
    """LoRA alpha (None: the train config's lora.alpha, else 16)"""
    targets: tuple[str, ...] | None = None
    """LoRA target modules (None: the train config's lora.targets, else q/k/v/o_proj)"""
    role_lora: tuple[str, ...] = ()
    """per-role LoRA settings, 'role:rank=8,alpha=16,dropout=0.05,targets=q_proj+v_proj' (any subset)"""
    lr: float = 2e-5
    """AdamW learning rate (2e-5 suits full-size models; the tiny CPU configs use ~1e-3)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    epochs: int = 1
    """passes over each adapter's examples"""
    min_steps: int = 0
    """each adapter trains at least this many optimizer steps, repeating its epochs as needed (0: epochs
    alone). A team's roles speak unequally often (a planner once an episode, its researchers five times),
    so one epoch count gives the rarest role the fewest steps; this lifts only the adapters below it"""
    micro_batch_size: int = 2
    """examples per forward/backward"""
    grad_accum: int = 4
    """micro-batches per optimizer step"""
    logits_chunk_tokens: int = 256
    """the loss's vocabulary projection runs this many tokens at a time, its backward by hand (ppo.head_logprobs):
    the whole (tokens x vocabulary) logits are never made, as algo.logits_chunk_tokens in RL. 0 = whole logits
    (also used for a model whose logits are not lm_head(norm(h)) alone)"""
    grad_clip: float = 1.0
    """max gradient norm per optimizer step"""
    warmup_steps: int = 0
    """linear LR warm-up (optimizer steps), then constant"""
    pack_turns: bool = False
    """an adapter's turns that extend one another (a later turn's tokens begin with an earlier turn's
    prompt + reply (+ EOS): a researcher's next round, a tool agent's next step) train as one sequence,
    every reply in the loss: each reply's loss is the same number as alone (causal attention), the
    shared prefix is read once (the research recipe's researcher: 2.5x fewer tokens). A conversation
    is shuffled as a unit and never split across optimizer steps; a step holds at most
    micro_batch_size x grad_accum turns (fewer where the next conversation does not fit, one longer
    conversation alone), so an epoch can take more steps than unpacked; min_steps stays a floor on the
    steps taken. The held-out split is drawn per turn before packing: a conversation's turns can land on
    both sides (a held-out reply is still never trained on). Off: each turn its own sequence, the steps of
    earlier runs"""
    max_len: int = 2048
    """examples longer than this (prompt + reply tokens) are dropped and counted"""
    val_frac: float = 0.1
    """share of each adapter's examples held out for the eval (at least one when there are two or more)"""
    eval_every: int = 0
    """held-out eval every N optimizer steps (0: before and after training only)"""
    seed: int = 0
    """seed of everything: shuffling, the held-out split, new adapters, the teacher, sampling"""
    out: str | None = None
    """output directory: <out>/<adapter>/ PEFT adapters, sft_loss.jsonl/.png, examples/, summary.json
    (None: <the train config's output_dir>/sft, else runs/sft)"""
    progress: bool = True
    """progress bars (stderr)"""
    device: str = "auto"
    """auto (cuda if available), cpu or cuda"""


def print_(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------------------------
# 1. sources: trajectory files (rewards.calculator.load_records checks them) and rejection sampling


def rejection_sample(model, tok, make_env, tasks: list[dict], specs: dict, k: int, calc: RewardCalculator,
                     max_turns: int = 8, max_model_len: int | None = None, max_batch_size: int = 64, seed: int = 0,
                     progress: bool = False) -> tuple[list[dict], list[dict]]:
    """Best of k: roll every task out k times with `specs` (role -> rollout.RoleSpec: the current
    policy's adapters), return (the best episode record per task, all records). Best = the highest
    team_reward (else the mean recorded reward), ties broken by the mean weighted reward, then the
    lowest episode id."""
    from rollout import TorchEngine, run_episodes
    engine = TorchEngine(model, tok, max_batch_size=max_batch_size, seed=seed)
    _, episodes = run_episodes(engine, tok, make_env, tasks, specs, num_chains=k, max_turns=max_turns,
                               max_model_len=max_model_len, progress=progress, seed_ids=list(range(len(tasks))))
    lora.set_adapter(model, None)
    records = [trajectories.episode_record(e, tok, "rejection", 0) for e in episodes]
    best: dict[int, tuple] = {}
    for r in records:
        turns = r["turns"]
        team = (r.get("metrics") or {}).get("team_reward")
        if team is None:
            team = sum(t["reward"] for t in turns) / len(turns) if turns else 0.0
        w = calc.score_episode(r)
        key = (float(team), sum(s.weighted for s in w) / len(w) if w else 0.0, -r["episode_id"])
        if r["task_id"] not in best or key > best[r["task_id"]][0]:
            best[r["task_id"]] = (key, r)
    return [best[t][1] for t in sorted(best)], records


# --------------------------------------------------------------------------------------------
# 2. filter turns by reward, 3. build examples


def select_turns(records, calc: RewardCalculator, min_reward: float, reward: str, roles) -> tuple[list, dict]:
    """[(source, record, turn, reward)] of the turns of `roles` whose reward >= min_reward, and counts per
    role: turns, kept, below (the threshold), cut (stopped by length), no_reward (recorded mode, null)."""
    kept, counts = [], defaultdict(lambda: dict.fromkeys(("turns", "kept", "below", "cut", "no_reward"), 0))
    for source, rec in records:
        for t, sc in zip(rec["turns"], calc.score_episode(rec)):
            if t["role"] not in roles:
                continue
            c = counts[t["role"]]
            c["turns"] += 1
            r = sc.weighted if reward == "weighted" else sc.recorded
            if t.get("finish_reason") == "length":
                c["cut"] += 1
            elif r is None:
                c["no_reward"] += 1
            elif r < min_reward:
                c["below"] += 1
            else:
                c["kept"] += 1
                kept.append((source, rec, t, r))
    return kept, {k: dict(v) for k, v in counts.items()}


# --------------------------------------------------------------------------------------------
# the whole run


def parse_role_lora(specs) -> dict[str, dict]:
    """'role:rank=8,alpha=16,dropout=0.05,targets=q_proj+v_proj' -> {role: {...}}; errors name the spec."""
    out = {}
    for spec in specs:
        role, sep, rest = spec.partition(":")
        d = {}
        for part in filter(None, rest.split(",")):
            k, eq, v = part.partition("=")
            try:
                if not sep or not eq or k not in ("rank", "alpha", "dropout", "targets"):
                    raise ValueError
                d[k] = int(v) if k == "rank" else tuple(v.split("+")) if k == "targets" else float(v)
                ok = {"rank": lambda x: x >= 1, "alpha": lambda x: 0 < x < math.inf, "dropout": lambda x: 0 <= x < 1,
                      "targets": all}[k]
                if not ok(d[k]):
                    raise ValueError
            except ValueError:
                raise ValueError(f"role_lora {spec!r}: expected 'role:rank=8,alpha=16,dropout=0.0,targets=a+b' (rank >= 1, "
                                 "alpha > 0 and finite, dropout in [0, 1))") from None
        check_name(role, f"sft option role_lora {spec!r}")
        out[role] = d
    return out


def check_options(cfg: SFTConfig):
    """Every number and name of an SFTConfig, before anything is read or written: a NaN or infinite lr
    or grad_clip saved a NaN adapter, a negative warm-up or grad_clip trained the loss upward."""
    def bad(name, msg):
        raise ValueError(f"sft option {name}: {msg}, got {getattr(cfg, name)!r}")
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    for name, lo in [("epochs", 1), ("min_steps", 0), ("micro_batch_size", 1), ("grad_accum", 1), ("max_len", 2),
                     ("rejection_k", 0), ("rejection_tasks", 0), ("teacher_tasks", 0), ("warmup_steps", 0),
                     ("eval_every", 0), ("seed", 0), ("logits_chunk_tokens", 0)]:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            bad(name, f"must be an integer >= {lo}")
    if cfg.seed > MAX_SEED:
        bad("seed", f"must be at most {MAX_SEED} (config.MAX_SEED)")
    if cfg.rank is not None and (isinstance(cfg.rank, bool) or not isinstance(cfg.rank, int) or cfg.rank < 1):
        bad("rank", "must be an integer >= 1 (or None)")
    if cfg.alpha is not None and not (num(cfg.alpha) and 0 < cfg.alpha < math.inf):
        bad("alpha", "must be a finite number > 0 (or None)")
    if not (num(cfg.lr) and 0 < cfg.lr <= MAX_LR):
        bad("lr", f"must be a number in (0, {MAX_LR}]")
    if not (num(cfg.grad_clip) and 0 < cfg.grad_clip < math.inf):
        bad("grad_clip", "must be a finite number > 0")
    if not (num(cfg.weight_decay) and 0 <= cfg.weight_decay < math.inf):
        bad("weight_decay", "must be a finite number >= 0")
    if not (num(cfg.min_reward) and math.isfinite(cfg.min_reward)):
        bad("min_reward", "must be a finite number")
    if not (num(cfg.val_frac) and 0 <= cfg.val_frac < 1):
        bad("val_frac", "must be in [0, 1)")
    if cfg.targets is not None and (not cfg.targets or not all(isinstance(t, str) and t for t in cfg.targets)):
        bad("targets", "must name at least one module (or None)")
    for r in cfg.roles:
        check_name(r, "sft option roles")
    for x in cfg.init_from:
        name, eq, path = str(x).partition("=")
        if not eq or not path:
            raise ValueError(f"sft option init_from {x!r}: expected 'adapter=DIR'")
        check_name(name, f"sft option init_from {x!r}")
    parse_role_lora(cfg.role_lora)


def fingerprint(cfg: SFTConfig, tc, records, inits: dict) -> dict:
    """What an SFT's result depends on, each part hashed: its options (not where it writes or whether it
    shows progress), the parts of the train config SFT reads (model, LoRA, roles' adapters and sampling,
    the workflow and its tasks, rollout, seed: not the RL algorithm or the run's length), the base model
    (a local file or directory: its files' names, sizes and mtimes), the training records, the task file
    (teacher, rejection sampling), the teacher's code (sft_teachers.teacher_code: the workflow's module and
    what it uses) and every init_from adapter's bytes. summary.json keeps it; a rerun
    whose fingerprint differs from a finished SFT's in the same directory is refused (run_sft)."""
    def h(x):
        return hashlib.sha256(json.dumps(x, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def file_bytes(path):
        p = Path(path)
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else str(path)
    skip = ("out", "progress", "train_config", "data", "model", "dtype")  # data and base: their own parts below
    opts = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in skip}
    if not opts["pack_turns"]:  # off: the options' hash as before the option existed (a teacher SFT's
        # "teacher" part changed with sft_teachers.py all the same)
        del opts["pack_turns"]
    parts = {"options": h(opts)}
    spec, dtype, seed = cfg.model, cfg.dtype, cfg.seed
    if tc is not None:
        from config import to_dict
        d = to_dict(tc)
        rl_only = ("lr", "adv_estimator", "frozen_steps", "trainable")
        parts["train_config"] = h({"model": d["model"], "lora": d["lora"], "seed": d["trainer"]["seed"],
                                   "roles": [{k: v for k, v in r.items() if k not in rl_only} for r in d["roles"]],
                                   "rollout": {k: v for k, v in d["rollout"].items() if k != "progress"},
                                   "data": {k: d["data"][k] for k in ("env", "env_kwargs", "train_files", "levels",
                                                                      "max_refinement_iterations", "reward_weights")},
                                   "tasks": file_bytes(tc.data.train_files)})
        spec, dtype, seed = tc.model.spec, tc.model.dtype, tc.trainer.seed
        if cfg.teacher != "none" or cfg.rejection_k:  # the teacher's turns, or the env that scores the samples
            from sft_teachers import teacher_code
            from workflows import workflow
            _, module, loader = workflow(tc)
            parts["teacher"] = h(teacher_code(module, loader))
    p = Path(spec)  # a preset (tiny: random weights from the seed), a hub id, or local files
    files = sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p] if p.is_file() else []
    parts["base_model"] = h([spec, dtype, seed] + [(x.name, x.stat().st_size, x.stat().st_mtime_ns) for x in files])
    parts["data"] = h([r for _, r in records])
    parts["init_from"] = h({a: [file_bytes(Path(d) / f) for f in ("adapter_config.json", "adapter_model.safetensors")]
                            for a, d in sorted(inits.items())})
    return parts


def run_sft(cfg: SFTConfig, train_cfg=None, model=None, tok=None, eval_hook=None) -> dict:
    """The whole pipeline (module docstring). train_cfg: a config.Config (or cfg.train_config's file);
    model, tok: a loaded base to train on (else loaded here). Returns the summary, whose "adapters"
    maps each adapter written to its directory (what train.py's init_from takes)."""
    from rundir import DirLock
    with contextlib.ExitStack() as held:  # --out's lock, taken once the options are checked, released however it ends
        return _run_sft(cfg, train_cfg, model, tok, eval_hook, lambda out: held.enter_context(DirLock(out, "sft.py")))


def _run_sft(cfg: SFTConfig, train_cfg, model, tok, eval_hook, hold) -> dict:
    t0 = time.perf_counter()
    check_options(cfg)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tc = load_train_config(cfg, train_cfg)
    out = Path(cfg.out or (Path(tc.trainer.output_dir) / "sft" if tc is not None else "runs/sft"))
    if out.exists() and not out.is_dir():
        raise ValueError(f"sft option out: {out} exists and is not a directory")
    device = (next(model.parameters()).device if model is not None else
              torch.device("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else
              torch.device(cfg.device))
    calc = RewardCalculator.from_config(tc, cfg.weights or None) if tc is not None else RewardCalculator(cfg.weights or None)

    # --- 1. sources: trajectory files (checked: a bad line is an error naming file:line) ------------
    records = read_trajectories(cfg.data)
    role_names, adapter_of, inits = plan_adapters(cfg, tc, records)
    adapters = sorted(set(adapter_of.values()))

    # --- done already? the same fingerprint: the same SFT (a rerun, train.py's mode=both resuming) ---
    from rundir import hub_id
    hold(out)  # one SFT per --out
    fp = fingerprint(cfg, tc, records, inits)
    if (old := finished_sft(out, fp)) is not None:
        return old
    out.mkdir(parents=True, exist_ok=True)

    # --- the model and its adapters: fresh, or from a saved adapter (the current policy) ----------
    spec, dtype, seed = (tc.model.spec, tc.model.dtype, tc.trainer.seed) if tc else (cfg.model, cfg.dtype, cfg.seed)
    if model is None:
        model, tok = load_model(spec, dtype, device, seed=seed)
    default = {"rank": cfg.rank or (tc.lora.rank if tc else 64), "alpha": cfg.alpha or (tc.lora.alpha if tc else 16.0),
               "dropout": 0.0, "targets": tuple(cfg.targets or (tc.lora.targets if tc else lora.ALL_LINEAR[:4]))}
    settings = lora_settings(cfg, default, adapters, role_names, adapter_of, inits)
    model_of = attach_adapters(model, settings, default["targets"], spec, seed)
    if tc and any(settings[a]["targets"] != tuple(sorted(tc.lora.targets)) for a in adapters):
        print_(f"note: some adapters' targets differ from the train config's lora.targets {tc.lora.targets}: "
               "train.py's init_from refuses those")

    # --- rejection sampling: the current policy's best of k per task -----------------------------
    summary: dict = {"sources": {"files": len({w.rsplit(':', 1)[0] for w, _ in records}), "episodes": len(records)}}
    tasks, teacher_records = [], records
    if tc is not None and (cfg.rejection_k or cfg.teacher in ("math", "scripted")):
        from workflows import load_data
        tasks = load_data(tc)[0]
    if cfg.rejection_k:
        records, teacher_records = rejection_stage(cfg, tc, model, tok, tasks, calc, model_of, out, records, summary)

    # --- 2. filter, 3. examples ----------------------------------------------------------------
    by_adapter = make_examples(cfg, tc, tok, records, teacher_records, tasks, calc, role_names, adapter_of, summary)

    # --- 5. train each adapter, 6. write ---------------------------------------------------------
    summary["losses"], summary["adapters"] = train_all(cfg, adapters, by_adapter, settings, model_of, tok, device, out,
                                                       eval_hook, hub_id(spec))
    summary["seconds"] = time.perf_counter() - t0
    tmp = out / "summary.json.tmp"  # written last, whole: its presence means the SFT finished
    tmp.write_text(json.dumps({"config": dataclasses.asdict(cfg), "fingerprint": fp, **summary}, indent=1, default=str))
    os.replace(tmp, out / "summary.json")
    return summary


def read_trajectories(data) -> list[tuple[str, dict]]:
    """[(file:line, episode record)] of the trajectory files `data` names (load_records checks each line);
    every turn must carry the prompt text the role saw."""
    records = load_records(data, with_source=True) if data else []
    for where, rec in records:
        for k, t in enumerate(rec["turns"]):
            if not isinstance(t.get("prompt"), str):
                raise TrajectoryError(f"{where}: turns[{k}] has no prompt text: SFT needs the prompt the role saw")
    return records


def load_train_config(cfg: SFTConfig, train_cfg):
    """The train config (given, or cfg.train_config's file: a configs/*.py or a run's config.json), validated;
    None without one. Refuses an SFT with nothing to learn from, or a source that needs a train config."""
    if train_cfg is None and cfg.train_config:
        from config import from_dict, load_config_file
        train_cfg = (from_dict(json.loads(Path(cfg.train_config).read_text())) if cfg.train_config.endswith(".json")
                     else load_config_file(cfg.train_config))
    if cfg.rejection_k and train_cfg is None:
        raise ValueError("rejection sampling (rejection_k) needs train_config: its workflow, roles and tasks")
    if cfg.teacher == "scripted" and train_cfg is None:
        raise ValueError("teacher=scripted plays the train config's workflow on its tasks: give train_config")
    if not cfg.data and not cfg.rejection_k and cfg.teacher == "none":
        raise ValueError("nothing to learn from: give data (trajectory globs), rejection_k or a teacher")
    if train_cfg is not None:  # its roles name the adapters, i.e. directories under out
        train_cfg.validate()
    return train_cfg


def plan_adapters(cfg: SFTConfig, tc, records) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(the roles to train, role -> its adapter, adapter -> the PEFT directory it starts from): the roles are
    --roles, else the train config's, else every role of the data (+ the math teacher's); every adapter name
    (a directory under out) and init_from directory is checked."""
    role_names = list(cfg.roles) or ([r.name for r in tc.roles] if tc else
                                      sorted({t["role"] for _, r in records for t in r["turns"]}
                                             | ({"evaluator_critique"} if cfg.teacher == "math" else set())))
    adapter_of = {r.name: tc.adapter_of(r) for r in tc.roles} if tc else {}
    adapter_of = {r: adapter_of.get(r, r) for r in role_names}
    for a in sorted(set(adapter_of.values())):  # role names may come from the data: each names a directory under out
        check_name(a, "sft: adapter (a role of the data, --roles or the train config)")
    inits = {tc.adapter_of(r): r.init_from for r in tc.roles if r.init_from} if tc else {}
    inits.update(s.split("=", 1) for s in cfg.init_from)  # check_options checked 'adapter=DIR'
    for a, d in inits.items():
        if not (Path(d) / "adapter_config.json").is_file():
            raise ValueError(f"sft option init_from: {d} is not a PEFT adapter directory (no adapter_config.json)")
    return role_names, adapter_of, inits


def finished_sft(out: Path, fp: dict) -> dict | None:
    """The summary of the SFT finished in `out` when its fingerprint is fp (this SFT: a rerun, train.py's
    mode=both resuming), None when none finished there; refuses (ValueError) to overwrite another one."""
    done = out / "summary.json"
    try:
        old = json.loads(done.read_text()) if done.exists() else None
    except (OSError, ValueError) as e:  # torn (it is written whole: a disk error): no finished SFT to keep
        print_(f"note: {done} is unreadable ({type(e).__name__}): the SFT runs again")
        old = None
    if old is None:
        return None
    old_fp = old.get("fingerprint") if isinstance(old, dict) and isinstance(old.get("fingerprint"), dict) else {}
    if old_fp == fp:
        print_(f"SFT: {done} holds the SFT of this config, base model and data: not run again")
        return old
    if "teacher" in fp and "teacher" not in old_fp and old_fp == {k: v for k, v in fp.items() if k != "teacher"}:
        print_(f"SFT: {done} holds the SFT of this config, base model and data, finished before sft.py recorded "
               "the teacher's code (not checked): not run again")
        return old
    differ = [k for k in fp if old_fp.get(k) != fp[k]]
    raise ValueError(f"{out} holds a finished SFT of another {', '.join(differ)} ({done}): refusing to overwrite "
                     "it; pass another --out (or delete the directory) to run this one")


def lora_settings(cfg: SFTConfig, default: dict, adapters, role_names, adapter_of, inits) -> dict[str, dict]:
    """adapter -> its LoRA settings: an init_from adapter's targets (from its adapter_config.json), else the
    defaults with its role's role_lora on top; targets sorted."""
    per_role = parse_role_lora(cfg.role_lora)
    settings = {}
    for a in adapters:
        if a in inits:
            f = Path(inits[a]) / "adapter_config.json"
            try:
                t = json.loads(f.read_text())["target_modules"]
            except (ValueError, KeyError, TypeError) as e:
                t = e
            if not isinstance(t, (str, list)):
                raise ValueError(f"init_from of {a}: {f} holds no list of target_modules ({str(t)[:100]})")
            settings[a] = {"init_from": inits[a], "targets": tuple(sorted([t] if isinstance(t, str) else t))}
        else:
            mine = [per_role[r] for r in role_names if adapter_of[r] == a and r in per_role]
            settings[a] = {**default, **(mine[0] if mine else per_role.get(a, {}))}
            settings[a]["targets"] = tuple(sorted(settings[a]["targets"]))
    return settings


def attach_adapters(model, settings: dict[str, dict], default_targets, spec: str, seed: int) -> dict:
    """Each adapter on a model: new (lora.add_lora) or loaded from its init_from. lora.py puts every adapter
    of one model on the same modules, so adapters with other targets share a deep copy of the base. The base
    itself takes the group on the targets it already wears (a caller's model), else the default targets.
    Returns adapter -> its model."""
    have = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, lora.LoRALinear))}
    for a in settings:  # the model's names are known only now: one line, not add_lora skipping a typo
        if set(settings[a]["targets"]) - have:
            raise ValueError(f"sft: adapter {a}'s LoRA targets {sorted(set(settings[a]['targets']) - have)} name no "
                             f"linear layer of {spec}; it has {sorted(have)}")
    groups = defaultdict(list)  # one model per set of target modules (lora.py: one set per model)
    for a in settings:
        groups[settings[a]["targets"]].append(a)
    first = ({p.rsplit(".", 1)[-1] for p in lora.lora_modules(model)} or set(default_targets))
    groups = dict(sorted(groups.items(), key=lambda kv: set(kv[0]) != first))
    pristine = copy.deepcopy(model) if len(groups) > 1 else None
    model_of = {}
    for i, (targets, names) in enumerate(groups.items()):
        m = model if i == 0 else copy.deepcopy(pristine)
        for a in names:
            s = settings[a]
            if "init_from" in s:
                lora.load_adapter(m, a, s["init_from"])
            else:
                lora.add_lora(m, [a], s["rank"], s["alpha"], s["dropout"], targets, seed=seed)
            model_of[a] = m
    return model_of


def rejection_stage(cfg: SFTConfig, tc, model, tok, tasks, calc, model_of, out: Path, records, summary: dict):
    """Rejection sampling (rejection_k): the current policy's best of k per task, written to rejection.jsonl
    (all) and rejection_best.jsonl. -> (records + the best, the teacher's records: those + all k samples)."""
    from rollout import RoleSpec, SamplingParams
    from workflows import workflow
    if len({id(m) for m in model_of.values()}) > 1:
        raise ValueError("rejection sampling needs every adapter on one model: give all roles the same targets")
    ro = tc.rollout
    specs = {r.name: RoleSpec(tc.adapter_of(r), SamplingParams(
        max_new_tokens=r.max_tokens, temperature=r.temperature, top_p=ro.top_p, top_k=ro.top_k, seed=cfg.seed))
        for r in tc.roles}
    rs_tasks = tasks[:cfg.rejection_tasks] if cfg.rejection_tasks else tasks
    best, every = rejection_sample(model, tok, workflow(tc)[0], rs_tasks, specs, cfg.rejection_k, calc,
                                   ro.max_turns, ro.max_model_len, ro.max_batch_size, cfg.seed, cfg.progress)
    trajectories.write(out / "rejection.jsonl", every)
    trajectories.write(out / "rejection_best.jsonl", best)
    records = records + [(f"rejection:task {r['task_id']}", r) for r in best]
    teacher_records = records + [(f"rejection:all task {r['task_id']}", r) for r in every]  # more own samples
    summary["sources"].update(rejection_tasks=len(rs_tasks), rejection_rollouts=len(every))
    return records, teacher_records


def make_examples(cfg: SFTConfig, tc, tok, records, teacher_records, tasks, calc, role_names, adapter_of,
                  summary: dict) -> dict[str, list[Example]]:
    """Steps 2-4: the kept turns of the records and the teacher's turns as tokenised Examples, per adapter;
    the counts (per role, and what was too long or empty) go into summary."""
    kept, counts = select_turns(records, calc, cfg.min_reward, cfg.reward, set(role_names))
    examples = [Example(adapter_of[t["role"]], t["role"], t["prompt"], t["reply"], t.get("finish_reason") == "stop",
                        src, r, prompt_ids=t.get("prompt_ids")) for src, _, t, r in kept]
    if cfg.teacher == "math":
        ev = adapter_of.get("evaluator_critique")
        if ev is None:
            raise ValueError("teacher=math trains evaluator_critique: add it to roles")
        style = (tc.data.env_kwargs.get("evaluator_prompt") if tc is not None else None) or "plain"
        teach, summary["teacher"] = math_teacher(teacher_records, tasks, tok, ev, cfg.teacher_tasks, cfg.seed, style)
        examples += teach
    if cfg.teacher == "scripted":
        from workflows import workflow
        make_env, module, _ = workflow(tc)
        teach, summary["teacher"] = scripted_teacher(make_env, module, tasks, tok, adapter_of, set(role_names),
                                                     cfg.teacher_tasks, cfg.min_reward)
        examples += teach
    by_adapter, too_long = defaultdict(list), defaultdict(int)
    for ex in examples:
        tokenize(ex, tok)
        if len(ex.ids) > cfg.max_len or len(ex.ids) == ex.n_prompt or ex.n_prompt == 0:
            too_long[ex.adapter] += 1
        else:
            by_adapter[ex.adapter].append(ex)
    summary["counts"] = counts
    summary["dropped_too_long_or_empty"] = dict(too_long)
    return by_adapter


def train_all(cfg: SFTConfig, adapters, by_adapter, settings, model_of, tok, device, out: Path, eval_hook,
              base_name: str) -> tuple[dict, dict]:
    """Steps 5-6 for every adapter (train_and_save), the loss log written as it goes (sft_loss.jsonl.tmp,
    renamed into place at the end) and plotted. -> (adapter -> its losses, adapter -> its directory)."""
    log_path, rows = out / "sft_loss.jsonl.tmp", []  # renamed when the SFT is done: a failed rerun never
    log_path.write_text("")                            # truncates a finished one's log

    def log(row):
        rows.append(row)
        with open(log_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    (out / "examples").mkdir(exist_ok=True)
    losses, dirs = {}, {}
    for a in adapters:
        res = train_and_save(cfg, a, by_adapter.get(a, []), settings[a], model_of[a], tok, device, out, log, eval_hook,
                             base_name)
        if res is not None:
            losses[a], dirs[a] = res, str(out / a)
    if rows:
        plot(rows, out / "sft_loss.png")
    os.replace(log_path, out / "sft_loss.jsonl")
    return losses, dirs


def train_and_save(cfg: SFTConfig, a: str, exs: list[Example], setting: dict, model, tok, device, out: Path, log,
                   eval_hook, base_name: str) -> dict | None:
    """Steps 5-6 for adapter `a`: hold out its val split, write what it trains on (examples/<a>.jsonl), train
    (packed when pack_turns), save it to <out>/<a>; -> its losses (sft_train.train_adapter), None without examples."""
    if not exs:
        print_(f"{a}: no example passed the filter; its adapter is not written")
        return None
    rng = random.Random(cfg.seed + zlib.crc32(a.encode()))
    order = rng.sample(range(len(exs)), len(exs))
    n_val = min(len(exs) - 1, max(1, round(cfg.val_frac * len(exs)))) if cfg.val_frac > 0 and len(exs) > 1 else 0
    val, train = [exs[i] for i in order[:n_val]], [exs[i] for i in order[n_val:]]
    with open(out / "examples" / f"{a}.jsonl", "w") as f:
        f.writelines(json.dumps({"split": split, "role": e.role, "source": e.source, "reward": e.reward,
                                 "prompt": e.prompt, "reply": e.reply, "eos": e.eos}) + "\n"
                     for split, part in (("train", train), ("val", val)) for e in part)
    print_(f"{a}: {len(train)} train / {len(val)} held-out examples, {sum(len(e.ids) - e.n_prompt for e in train)} "
           f"reply tokens | rank/alpha {setting.get('rank', 'from ' + str(setting.get('init_from')))}"
           f"/{setting.get('alpha', '-')} targets {list(setting['targets'])}")
    packed = None
    if cfg.pack_turns:
        tokens = sum(len(e.ids) for e in train + val)
        train, val = pack_conversations(train), pack_conversations(val)
        packed = {"turns": sum(e.turns() for e in train + val), "sequences": len(train) + len(val),
                  "tokens_unpacked": tokens, "tokens": sum(len(e.ids) for e in train + val)}
        print_(f"{a}: pack_turns: {packed['turns']} turns in {packed['sequences']} sequences, "
               f"{packed['tokens_unpacked']} -> {packed['tokens']} tokens")
    res = train_adapter(model, a, train, val, cfg, tok.pad_token_id, device, log, eval_hook)
    if packed:
        res["packed"] = packed
    lora.save_adapter(model, a, out / a, base_model_name_or_path=base_name)
    print_(f"{a}: {res['steps']} steps, train loss {res['train_loss_first']:.4f} -> {res['train_loss_last']:.4f}"
           + (f", held-out {res['val_loss_before']:.4f} -> {res['val_loss_after']:.4f}" if val else "")
           + f" | saved {out / a}")
    return res


# --------------------------------------------------------------------------------------------
# train.py's mode = sft | both


def load_sft_config(path: str) -> SFTConfig:
    """Execute a file that builds `config = SFTConfig(...)`."""
    spec = importlib.util.spec_from_file_location("troupe_sft_config", path)
    if spec is None or not Path(path).is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = getattr(mod, "config", None)
    if type(cfg).__name__ != "SFTConfig":
        raise TypeError(f"{path} must define `config = SFTConfig(...)`, found {type(cfg).__name__}")
    return SFTConfig(**dataclasses.asdict(cfg))  # the file may have imported sft as another module


def cli(argv=None) -> SFTConfig:
    """`--config file.py` (an SFTConfig) first, then flags on top (tyro; --help lists them)."""
    import tyro
    from config import pop_config_arg
    path, argv = pop_config_arg(sys.argv[1:] if argv is None else argv)
    try:
        base = load_sft_config(path) if path else SFTConfig()
    except (FileNotFoundError, TypeError) as e:  # a missing file or one without `config`: one line
        raise ValueError(f"--config: {e}") from None
    return tyro.cli(SFTConfig, default=base, args=argv, description=__doc__.split("\n")[0] +
                    "\n\n--config PATH: a file building `config = SFTConfig(...)`; flags override its fields.")


if __name__ == "__main__":
    try:
        run_sft(cli())
    except (TrajectoryError, ValueError, FileNotFoundError) as e:  # bad input: one clear line, not a traceback
        sys.exit(f"error: {e}")

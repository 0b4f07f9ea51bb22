"""troupe's trainer: several roles, one base model, one LoRA adapter per role, PPO/GRPO updates.

    python train.py --config configs/tiny_math_3agent.py                 # CPU, under a minute
    python train.py --config configs/smollm2_math_cpu.py                 # the CPU demo
    torchrun --nproc_per_node 8 train.py --config configs/math_3agent.py # GPUs, FSDP2 + vLLM
    python train.py --config configs/X.py --algo.adv-estimator rloo --trainer.total-steps 10

The story, as `main` reads: config -> build (model, adapters, optimizers, engine; session.py) ->
loop: collect (this step's tasks from the seeded stream -> every role's turns in one engine) ->
learner (learner.py: which turns train; per adapter score -> advantages -> the policy update) ->
sync the engine -> log -> eval -> save. The algorithm itself lives in ppo.py (ADVANTAGES,
LOSSES); the learner feeds it tensors; collectives.py is all there is of distributed plumbing.

Distributed (torchrun): each rank rolls out its share of the tasks (all chains of a task on one
rank, so groups are local), the model is FSDP2-sharded per decoder layer then at the root (or, with
trainer.strategy replicate, whole on every rank, its adapters' gradients averaged once per step), the
loss is normalised by the global token count, metrics are reduced, rank 0 logs and writes
checkpoints. Batch-whitened estimators (reinforce++, gae) whiten per rank.

Packing: turns of one adapter that extend one another (a conversation's turns) share one row in the update
(algo.pack_turns, on by default); unrelated sequences are not packed together. Deliberately left out:
context parallelism, async rollouts, a reward model; GAE's value model is a linear head on the shared base
wearing its own "critic" adapter.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: docs/benchmarks.md "Threads"

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import collectives
import idle
import learner
import session
import trajectories
from collectives import all_sum, launched, print0, rank, world
from config import Config, ConfigError, load_config_file, pop_config_arg, pop_env_kwargs, to_dict
from rewards.calculator import RewardCalculator, rescore_episodes
from rollout import Sample, merge_turns
from rundir import (
    DirLock,
    Logger,
    config_changes,
    duration,
    fmt,
    resolve_resume,
    save_checkpoint,
)
from session import (
    build,
    eval_metrics,
    finish,
    role_specs,
    save_trajectories,
    summarize,
)
from workflows import check_names, check_roles, load_data, workflow

# --------------------------------------------------------------------------------------------
# the parts of the loop


def collect(run, train_tasks, step_seed):
    """This step's episodes: batch_size new tasks from the seeded stream, plus, under dynamic
    sampling with refill, more batches while fewer than batch_size tasks kept an informative group."""
    cfg, B = run.cfg, run.cfg.data.batch_size
    samples, episodes, rounds = [], [], 0
    baseline = role_specs(cfg, None, greedy=True) if "remax" in cfg.estimators else None
    while True:
        ids = []  # (global task id = position in the stream, task index): a seeded permutation per epoch
        for _ in range(B):
            epoch, pos = divmod(run.cursor, len(train_tasks))
            perm = np.random.RandomState(cfg.trainer.seed + epoch).permutation(len(train_tasks))
            ids.append((run.cursor, int(perm[pos])))
            run.cursor += 1
        mine = ids[rank()::world()]
        s, e = session.episodes(run.engine, run.tok, cfg, [train_tasks[i] for _, i in mine], [g for g, _ in mine],
                                role_specs(cfg, step_seed), cfg.rollout.num_chains, cfg.rollout.progress, baseline,
                                tree=cfg.rollout.tree_sampling)
        if cfg.data.reward == "calculator":  # the weighted components replace the env's reward (kept in Sample.env_reward)
            rescore_episodes(RewardCalculator.from_config(cfg), e)
        learner.mix_team_reward(cfg, e)  # roles[i].team_reward_weight (the role's own reward kept for the logs)
        samples, episodes = samples + s, episodes + e
        if not cfg.algo.dynamic_sampling or rounds == cfg.algo.dynamic_sampling_max_rounds:
            return samples, episodes, rounds
        if all_sum(float(len({x.task_id for x in learner.informative(cfg, samples)}))) >= B:
            return samples, episodes, rounds
        rounds += 1


def evaluate(run, val_tasks, out: Path | None = None, logger=None) -> dict:
    """Greedy episodes on the validation tasks; when `out` is given, writes them all, prints one and
    puts the first few in the logger's wandb table (the same tasks at every eval)."""
    mine = list(range(rank(), len(val_tasks), world()))
    samples, episodes = session.episodes(run.engine, run.tok, run.cfg, [val_tasks[i] for i in mine], mine,
                                         role_specs(run.cfg, None, greedy=True), 1, progress=run.cfg.rollout.progress)
    if out is not None:
        records = save_trajectories(run, episodes, out / "trajectories" / f"val_step_{run.step:06d}.jsonl", "val", 1.0)
        if records:
            print0(trajectories.show(records[0]))
            if logger is not None:
                logger.episodes(run.step, records)
    run.engine.release()
    return eval_metrics(run, samples, episodes, "val")


def evaluate_checkpoint(run, ckpt: Path, val_tasks, show) -> dict:
    """trainer.eval_only: the resumed checkpoint's val metrics, written next to it (eval_metrics.json) and
    printed; the training log is never touched."""
    metrics = evaluate(run, val_tasks)
    if rank() == 0:
        (ckpt / "eval_metrics.json").write_text(json.dumps({"step": run.step, **metrics}, indent=1))
        print(f"[eval of {ckpt}] " + fmt(metrics, "val", show), flush=True)
    return metrics


def empty_reason(cfg: Config, samples: list[Sample], episodes) -> str | None:
    """Why this step trains on nothing, or None."""
    trainable = {r.name for r in cfg.roles if r.trainable}
    n_tok, n_trunc, n_eps = all_sum([float(sum(len(s.completion_ids) for s in samples if s.role in trainable)),
                                     float(sum(e.truncated and not e.samples for e in episodes)), float(len(episodes))])
    if n_tok > 0:
        return None
    if n_eps and n_trunc == n_eps:
        return (f"every episode was truncated before its first turn: prompt + max_tokens > rollout.max_model_len="
                f"{cfg.rollout.max_model_len}")
    return "no trainable role produced a token"


def sft_stage(cfg: Config) -> Config | None:
    """mode sft|both: sft.py's pipeline (cfg.sft_config, with this config as its train config) into
    <output_dir>/sft, run as its own process (sft.py skips an SFT it already holds of the same
    config, base and data: a rerun or a resume; it refuses to overwrite another). sft: None (stop there); both: this config with every role whose adapter SFT wrote
    starting from it (init_from; a role's own init_from wins)."""
    out = Path(cfg.trainer.output_dir) / "sft"
    if world() > 1 and not (out / "summary.json").exists():
        raise ConfigError("config field mode: SFT runs on one process; run `python sft.py --config ...` first, "
                          "then RL with torchrun and each role's init_from")
    if rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        tc = out / "train_config.next.json"  # replaces train_config.json once SFT succeeds (a refused rerun keeps it)
        tc.write_text(json.dumps(to_dict(cfg), indent=1))
        r = subprocess.run([sys.executable, str(Path(__file__).with_name("sft.py")), "--config", cfg.sft_config,
                            "--train-config", str(tc), "--out", str(out)])
        if r.returncode:
            tc.unlink(missing_ok=True)
            raise ConfigError(f"config field sft_config: the SFT stage ({cfg.sft_config}) failed with exit code "
                              f"{r.returncode} (its output is above)")
        os.replace(tc, out / "train_config.json")
    if cfg.mode == "sft":
        return None
    written = json.loads((out / "summary.json").read_text())["adapters"]  # adapter -> directory
    roles = tuple(dataclasses.replace(r, init_from=r.init_from or written.get(cfg.adapter_of(r))) for r in cfg.roles)
    print0("RL starts from SFT: " + (", ".join(f"{a} <- {d}" for a, d in written.items()) or "no adapter was written"))
    return dataclasses.replace(cfg, roles=roles, mode="rl").validate()


# --------------------------------------------------------------------------------------------


def checked(cfg: Config):
    """Every name and value checked, the data read, the SFT stage run (mode sft/both) and the checkpoint
    to resume chosen, all before any model loads. (cfg, ckpt, changes, train_tasks, val_tasks), or None
    when mode=sft ends the run."""
    cfg.validate()
    check_names(cfg)
    learner.check_names(cfg)
    check_roles(cfg)
    train_tasks, val_tasks = load_data(cfg)
    if cfg.mode != "rl":
        cfg = sft_stage(cfg)
        if cfg is None:
            return None
    if cfg.algo.kl_ref == "init" and not cfg.trainer.eval_only and not any(r.init_from and r.trainable for r in cfg.roles):
        raise ConfigError("config field algo.kl_ref: 'init' changes nothing here: no trainable role has init_from, and "
                          "a fresh adapter starts at the base (the 'base' reference)")  # after the SFT stage fills them in
    if launched():
        collectives.init()  # rank 0 picks the checkpoint for every rank (resolve_resume): the group must be up
    ckpt = resolve_resume(cfg, Path(cfg.trainer.output_dir))
    changes = config_changes(cfg, ckpt) if ckpt is not None and (ckpt / "config.json").exists() else []
    if changes and not (cfg.trainer.resume_if_changed or cfg.trainer.eval_only):
        raise ConfigError(f"config field trainer.resume: {ckpt} was written with another config ({'; '.join(changes)}); "
                          "resuming would mix the two (its optimizer state, for one, keeps the old lr). Pass "
                          "--trainer.resume-if-changed to resume anyway, or --trainer.output-dir NEW to start fresh")
    return cfg, ckpt, changes, train_tasks, val_tasks


def experience(run, train_tasks, step: int, step_seed: int):
    """This step's episodes (collect) and the turns that train: merged (rollout.merge_turns), then
    DAPO's filter and trim and the env-labelled uniform groups out (learner.select). Returns (episodes,
    kept turns, metrics, why nothing trains or None)."""
    cfg = run.cfg
    t0 = time.perf_counter()
    prefilled = getattr(run.engine, "prefilled_tokens", None)  # TorchEngine counts the prompt tokens it forwards
    samples, episodes, extra_rounds = collect(run, train_tasks, step_seed)
    run.engine.release()  # the rollout's prefix cache would hold its KV through the update
    n_tokens = all_sum(float(sum(len(s.completion_ids) for s in samples)))
    t_roll = time.perf_counter() - t0
    metrics = summarize(cfg, samples, episodes, "train")
    metrics.update({"train/gen_tokens": n_tokens,  # every role's generated tokens this step (the token budget arms compare)
                    "time/rollout": t_roll, "perf/tokens_per_s": n_tokens / max(t_roll, 1e-9)})
    if prefilled is not None:  # prompt tokens prefilled this step (the rest came from the prefix cache)
        metrics["perf/prefill_tokens"] = all_sum(float(run.engine.prefilled_tokens - prefilled))
    if cfg.rollout.merge_turns:
        samples = merge_turns(samples)
    kept, sm = learner.select(cfg, samples)
    metrics.update(sm | ({"train/extra_rollouts": float(extra_rounds)} if cfg.algo.dynamic_sampling else {}))
    return episodes, kept, metrics, empty_reason(cfg, samples, episodes)


def report_idle(run, kept: list[Sample], metrics: dict, step: int):
    """No role stops learning without a word: each trainable role due this step that learns nothing from its
    rewards (idle.idle_roles: no turn, every turn filtered out, every advantage 0) gets a console line naming
    it and why, and train/idle/<role> = 1 (0 for the others due); from IDLE_AFTER such steps in a row on, the
    line says what to change. A role not due (frozen_steps, train_windows) is left out and its count kept."""
    cfg = run.cfg
    stalled = idle.idle_roles(cfg, kept, metrics, step)
    for r in cfg.roles:
        if r.trainable and cfg.trains_at(r, step):
            metrics[f"train/idle/{r.name}"] = float(r.name in stalled)
            run.idle[r.name] = run.idle.get(r.name, 0) + 1 if r.name in stalled else 0
    for role, (code, why) in stalled.items():
        n = run.idle[role]
        print0(f"[step {step}] WARNING: role {role} gets no learning signal this step: {why}" +
               (f" ({n} steps in a row; to change it: {idle.IDLE_ADVICE[code]})" if n >= IDLE_AFTER else ""))


IDLE_AFTER = 3  # steps in a row a role learned nothing before its warning says what to change


def main(cfg: Config):
    # --- config: every name and value checked, data read, before any model loads -------------
    ready = checked(cfg)
    if ready is None:
        return {}
    cfg, ckpt, changes, train_tasks, val_tasks = ready
    lock = DirLock(cfg.trainer.output_dir, "train.py")  # noqa: F841 (one run per directory; released as main returns)

    # --- build --------------------------------------------------------------------------------
    run, out = build(cfg, ckpt)
    if ckpt is not None:
        print0(f"resumed from {ckpt} (step {run.step})" + (f"; changed: {'; '.join(changes)}" if changes else ""))
    print0(run.describe() + f" | tasks: {len(train_tasks)} train, {len(val_tasks)} val | output {out}")
    t_cfg = cfg.trainer
    show = tuple(getattr(workflow(cfg)[1], "CONSOLE", ())) + tuple(t_cfg.console)  # more metrics on the console
    total = t_cfg.total_epochs * max(1, len(train_tasks) // cfg.data.batch_size) if t_cfg.total_epochs else t_cfg.total_steps
    if t_cfg.eval_only:
        return finish(evaluate_checkpoint(run, ckpt, val_tasks, show))
    if run.step >= total:
        print0(f"note: {out} already finished at step {run.step} of {total}: nothing to train. Raise "
               "--trainer.total-steps to go on, or start anew with --trainer.output-dir NEW (or --trainer.resume none)")
    logger = Logger(run, out)
    if t_cfg.val_before_train and run.step == 0:
        metrics = evaluate(run, val_tasks, out, logger)
        logger.log(0, metrics, "[eval step 0] " + fmt(metrics, "val", show))

    # --- the loop -----------------------------------------------------------------------------
    metrics, empty_in_a_row, t_loop, first = {}, 0, time.perf_counter(), run.step + 1
    for step in range(run.step + 1, total + 1):
        run.step = step
        t0 = time.perf_counter()
        step_seed = (t_cfg.seed * 1_000_003 + step * 7_919) % (2**31)  # primes: distinct seeds per (seed, step)
        episodes, kept, metrics, reason = experience(run, train_tasks, step, step_seed)
        empty_in_a_row = empty_in_a_row + 1 if reason else 0
        if reason:
            print0(f"[step {step}] WARNING: this step trains on nothing: {reason}")
            metrics["train/empty_step"] = 1.0
            if empty_in_a_row >= t_cfg.max_empty_steps:
                raise RuntimeError(f"{empty_in_a_row} steps in a row trained on nothing ({reason}); stopping "
                                   f"(trainer.max_empty_steps={t_cfg.max_empty_steps})")

        # --- the learner: per adapter score -> advantages -> update, every adapter at once ------
        t1 = time.perf_counter()
        metrics.update(learner.update(run, kept, step, step_seed))
        report_idle(run, kept, metrics, step)
        save_trajectories(run, episodes, out / "trajectories" / f"train_step_{step:06d}.jsonl", "train", t_cfg.trajectory_sample)
        t_train = time.perf_counter() - t1

        # --- sync the engine, log -------------------------------------------------------------
        t2 = time.perf_counter()
        run.engine.sync()
        t_sync = time.perf_counter() - t2
        metrics.update({"time/train": t_train, "time/sync": t_sync, "time/step": time.perf_counter() - t0,
                        "train/epoch": run.cursor / len(train_tasks)})
        eta = (time.perf_counter() - t_loop) / (step - first + 1) * (total - step)  # evals and saves included
        logger.log(step, metrics, f"[step {step}/{total}] " + fmt(metrics, "train", show) +
                   f" | {metrics['perf/tokens_per_s']:.0f} tok/s | roll {metrics['time/rollout']:.1f}s train {t_train:.1f}s"
                   f" sync {t_sync:.2f}s | ETA {duration(eta)}")

        # --- eval, then checkpoint (a checkpoint implies every line of its step is logged) -----
        if t_cfg.test_freq and (step % t_cfg.test_freq == 0 or step == total):
            vm = evaluate(run, val_tasks, out, logger)
            metrics.update(vm)
            logger.log(step, vm, f"[eval step {step}] " + fmt(vm, "val", show))
            logger.plot(out, [r.name for r in cfg.roles])
        if (t_cfg.save_freq and step % t_cfg.save_freq == 0) or step == total:
            save_checkpoint(run, out)
    if not (t_cfg.test_freq and first <= total):  # with test_freq on, the last step evaluated and drew the plot
        logger.plot(out, [r.name for r in cfg.roles])
    return finish(metrics)


def cli(argv=None) -> Config:
    """`--config file.py` (or --config=file.py), then tyro overrides on top of it."""
    import tyro
    path, argv = pop_config_arg(sys.argv[1:] if argv is None else argv)
    env_kwargs, argv = pop_env_kwargs(argv)  # any key, listed in the config file or not
    try:
        base = load_config_file(path) if path else Config()
    except (FileNotFoundError, TypeError) as e:  # a missing file or one without `config`: one line, not a traceback
        raise ConfigError(f"--config: {e}") from None
    desc = (__doc__.split("\n")[0] + "\n\n--config PATH (or --config=PATH): a configs/*.py file building `config = "
            "Config(...)`; it goes first and the flags below override its fields (defaults shown are the file's).")
    cfg = tyro.cli(Config, default=base, args=argv, description=desc)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={**cfg.data.env_kwargs, **env_kwargs}))


if __name__ == "__main__":
    from data.math_data import DataError
    try:
        main(cli())
    except (ConfigError, DataError) as e:  # bad input: one clear line, not a traceback
        sys.exit(f"error: {e}")
    if launched():  # see session.finish: leave without tearing the process group down
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

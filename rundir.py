"""The run directory: checkpoints (save / load, paired), metrics.jsonl, wandb and rewards.png.

    runs/X/metrics.jsonl                         one JSON line per train step and per eval
    runs/X/rewards.png                           per-role reward curves, refreshed at every eval
    runs/X/checkpoints/step_N/adapters/<name>/   each adapter in PEFT format
    runs/X/checkpoints/step_N/trainer_state.pt   step, data cursor, optimizers, schedulers, KL, wandb id
    runs/X/checkpoints/step_N/rng_rank<r>.pt     each rank's RNG states (python, numpy, torch, CUDA,
                                                 engine) and its shard of the critic's optimizer
    runs/X/checkpoints/step_N/config.json        the config that wrote it

A checkpoint is written into step_N.tmp and renamed when complete, so a crash mid-save leaves
the previous one intact. Every rank calls save/load (gathering FSDP shards is a collective);
rank 0 writes the shared files. Loading the adapters happens before sharding (load_adapters),
the rest after (load_checkpoint).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import lora
from config import Config, to_dict


def _rank_world():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def ckpt_dirs(out: Path) -> list[Path]:
    d = out / "checkpoints"
    return sorted([p for p in d.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")]) if d.exists() else []


def save_checkpoint(run, out: Path):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    RANK, _ = _rank_world()
    final = out / "checkpoints" / f"step_{run.step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    if RANK == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    for name in run.cfg.adapters + (["critic"] if run.critic else []):
        lora.save_adapter(run.model, name, tmp / "adapters" / name, base_model_name_or_path=run.cfg.model.spec)
    opt_states = {n: get_optimizer_state_dict(run.model, o, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                  for n, o in run.opts.items()}
    per_rank = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "engine": run.engine.state_dict() if hasattr(run.engine, "state_dict") else None,
                "critic": run.critic.state_dict() if run.critic else None}  # the critic's optimizer is per-rank
    torch.save(per_rank, tmp / f"rng_rank{RANK}.pt")
    if RANK == 0:
        torch.save({"step": run.step, "cursor": run.cursor, "wandb_id": run.wandb_id, "kl": run.kl_ctrl.state_dict(),
                    "optim": opt_states, "sched": {n: s.state_dict() for n, s in run.scheds.items()}},
                   tmp / "trainer_state.pt")
        (tmp / "config.json").write_text(json.dumps(to_dict(run.cfg), indent=2))
    _barrier()
    if RANK == 0:
        os.replace(tmp, final)
        for old in ckpt_dirs(out)[:-run.cfg.trainer.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()


def load_checkpoint(run, ckpt: Path):
    """Restore what save_checkpoint wrote, except the adapters: those are loaded into the plain
    model before sharding (load_adapters)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    RANK, _ = _rank_world()
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    run.step, run.cursor, run.wandb_id = state["step"], state["cursor"], state.get("wandb_id")
    for n, o in run.opts.items():
        set_optimizer_state_dict(run.model, o, optim_state_dict=state["optim"][n],
                                 options=StateDictOptions(full_state_dict=True))
        run.scheds[n].load_state_dict(state["sched"][n])
    run.kl_ctrl.load_state_dict(state["kl"])
    rng = torch.load(ckpt / f"rng_rank{RANK}.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if rng["engine"] is not None and hasattr(run.engine, "load_state_dict"):
        run.engine.load_state_dict(rng["engine"])
    if run.critic:
        run.critic.load_state_dict(rng["critic"])


def load_adapters(model, ckpt: Path, names):
    for name in names:
        lora.load_adapter(model, name, ckpt / "adapters" / name)


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


class Logger:
    """metrics.jsonl (+ wandb, console) on rank 0; other ranks' calls are no-ops."""

    def __init__(self, run, out: Path):
        self.path, self.wandb = out / "metrics.jsonl", None
        self.rank0 = _rank_world()[0] == 0
        if not self.rank0:
            return
        if self.path.exists():  # a resumed run: drop lines past the checkpoint (a killed run's tail)
            keep = []
            for ln in self.path.read_text().splitlines():
                try:
                    if json.loads(ln)["step"] <= run.step:
                        keep.append(ln)
                except (ValueError, KeyError, TypeError):  # a torn last line (killed mid-write)
                    continue
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(ln + "\n" for ln in keep))
            os.replace(tmp, self.path)  # atomic: a crash here never loses the lines we keep
        if "wandb" in run.cfg.trainer.logger:
            import wandb
            run.wandb_id = run.wandb_id or uuid.uuid4().hex[:8]  # saved in checkpoints: a resume continues it
            self.wandb = wandb.init(project=run.cfg.trainer.wandb_project, dir=str(out), config=to_dict(run.cfg),
                                    name=out.name, id=run.wandb_id, resume="allow")

    def log(self, step, metrics: dict, console: str | None = None):
        if not self.rank0:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if console:
            print(console, flush=True)

    def plot(self, out: Path, roles):
        if not self.rank0 or not self.path.exists():
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
                    ax.plot(*zip(*pts), marker="o", label=r)
            ax.set(title=f"{prefix} reward per role", xlabel="step", ylim=(-0.05, 1.05))
            if ax.get_lines():
                ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "rewards.png", dpi=100)
        plt.close(fig)


def fmt(m: dict, prefix: str) -> str:
    parts = [f"{k.split('/')[-1]} {v:.3f}" for k, v in m.items() if k.startswith(f"{prefix}/reward/")]
    for k in ("team_reward", "kl"):
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

"""The run directory: checkpoints (save / load, paired), metrics.jsonl, wandb and rewards.png.

    runs/X/metrics.jsonl                         one JSON line per train step and per eval
    runs/X/rewards.png                           per-role reward curves, refreshed at every eval
    runs/X/checkpoints/step_N/adapters/<name>/   each adapter in PEFT format
    runs/X/checkpoints/step_N/trainer_state.pt   step, data cursor, optimizers, schedulers, KL, wandb id
    runs/X/checkpoints/step_N/rng_rank<r>.pt     each rank's RNG states (python, numpy, torch, CUDA,
                                                 engine) and its shard of the critic's optimizer
    runs/X/checkpoints/step_N/config.json        the config that wrote it
    runs/X/checkpoints/step_N/tokenizer/         the tokenizer, chat template included
    runs/X/checkpoints/step_N/manifest.json      written last: every file's size and sha256

A checkpoint is written into step_N.tmp, its manifest last, and renamed when complete, so a crash
mid-save leaves the previous one intact; rotation (keep_checkpoints) deletes an old checkpoint's own
files and keeps what else its folder holds (eval.py's <checkpoint>/eval). resume=auto takes the newest
checkpoint whose manifest, sizes, checksums, states and (finite) adapters all check out, and says which
it skipped and why;
eval.py, play.py and export.py load a checkpoint through the same checks (checkpoint_config), so a
bad file is one line naming it there too. Every rank calls save/load (gathering FSDP shards is a collective);
rank 0 writes every file of a checkpoint, the other ranks' RNG states included (gathered to it), and rank 0
alone picks the checkpoint to resume from. Every rank then reads that checkpoint: the run directory must be
on a filesystem every rank shares (one that is not is refused in one line at the resume, never half-loaded). Loading the adapters happens before sharding (load_adapters),
the rest after (load_checkpoint).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import lora
from collectives import sharded
from config import Config, ConfigError, from_dict, to_dict


def _rank_world():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier():
    if dist.is_initialized():
        dist.barrier()


_HELD: dict[str, list] = {}  # lock file -> [fd, (st_dev, st_ino), holds]: the locks this process holds
_STARTED = time.strftime("%Y-%m-%d %H:%M:%S %z")  # ~ when this process started (a lock names its holder by it)


class DirLock:
    """One process at a time in a directory (train.py's run directory, sft.py's --out, a recipe's): two runs in one
    directory doubled every metrics line, or left one's loss log under the other's summary. <dir>/.lock is
    flock'ed, and the holder's pid, host and start time written in it; another process is refused with one
    ConfigError line naming them. Stale locks: an flock belongs to its open file, and the kernel drops it when the
    process ends, however it ends (kill -9 included): a lock file left behind by a dead run never blocks, whatever
    pid it names. The same process may take its own lock again (an in-process caller: a test, a notebook).
    Released by release(), at the end of a with block, or when the object is collected (a function's local:
    when it returns), leaving the lock file empty. Under torchrun only rank 0 takes it (the ranks of one run
    share the directory)."""

    def __init__(self, directory, who: str):
        self.held, directory = None, Path(directory)
        if os.environ.get("RANK", "0") != "0":
            return
        path = directory / ".lock"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"{directory}: cannot be used ({e.strerror or e})") from None
        st, key = os.fstat(fd), str(path.resolve())
        held = _HELD.get(key)
        if held and held[1] == (st.st_dev, st.st_ino):  # this process holds it already
            os.close(fd)
            held[2] += 1
            self.held = held
            return
        try:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # a filesystem without flock: say so, run on
                print(f"note: {path} cannot be locked here ({e.strerror}): nothing stops a second run in {directory}")
                return
            try:
                h = json.loads(holder)
                holder = f"{h['who']} (pid {h['pid']} on {h['host']}, since {h['started']})"
            except (ValueError, KeyError, TypeError):
                holder = "another process (its lock file names none)"
            raise ConfigError(f"{directory} is in use by {holder}: two runs in one directory mix their files; wait "
                              "for it to end, or stop it") from None
        import socket
        me = {"who": who, "pid": os.getpid(), "host": socket.gethostname(), "started": _STARTED}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode() + b"\n", 0)
        self.held = _HELD[key] = [fd, (st.st_dev, st.st_ino), 1]

    def release(self):
        held, self.held = self.held, None
        if held is not None:
            held[2] -= 1
            if held[2] == 0:
                os.ftruncate(held[0], 0)  # free: it names nobody
                os.close(held[0])  # the flock goes with it
                for k in [k for k, v in _HELD.items() if v is held]:
                    del _HELD[k]

    __del__ = release

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


FREE_ON_RESUME = ("trainer.total_steps", "trainer.total_epochs", "trainer.save_freq", "trainer.keep_checkpoints",
                  "trainer.test_freq", "trainer.val_before_train", "trainer.resume", "trainer.resume_if_changed",
                  "trainer.eval_only", "trainer.logger", "trainer.wandb_project", "trainer.max_empty_steps",
                  "trainer.output_dir", "trainer.threads", "rollout.progress", "data.val_size", "trainer.adapter_kl_turns",
                  "trainer.strategy")


def config_changes(cfg: Config, ckpt: Path) -> list[str]:
    """Fields where cfg differs from the config a checkpoint was written with (beyond FREE_ON_RESUME)."""
    def flat(d, pre=""):
        return {k2: v2 for k, v in d.items() for k2, v2 in (flat(v, f"{pre}{k}.").items() if isinstance(v, dict)
                                                            else [(f"{pre}{k}", v)])}

    def moved_with_the_run(d):  # each role's init_from as seen from the run directory: a run directory moved
        run = os.path.abspath(d["trainer"]["output_dir"])  # with the adapters it started from (a recipe's rl/ and
        for r in d["roles"]:                               # sft/) is the same run
            if r.get("init_from"):
                r["init_from"] = os.path.relpath(os.path.abspath(r["init_from"]), run)
        return flat(d)
    # the checkpoint's config read back through from_dict: fields added since take their defaults, so a
    # checkpoint of an older troupe resumes unless something it knew about changed
    old = moved_with_the_run(json.loads(json.dumps(to_dict(from_dict(json.loads((ckpt / "config.json").read_text()))))))
    new = moved_with_the_run(json.loads(json.dumps(to_dict(cfg))))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
            if k not in FREE_ON_RESUME and old.get(k) != new.get(k)]


def ckpt_dirs(out: Path) -> list[Path]:
    """The run's step_N directories, oldest first by N (not by name: a hand-made step_2 is older than step_000004)."""
    d = out / "checkpoints"
    steps = [p for p in d.glob("step_*") if p.is_dir() and p.name[5:].isascii() and p.name[5:].isdigit()] \
        if d.exists() else []
    return sorted(steps, key=lambda p: (int(p.name[5:]), p.name))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(run, out: Path):
    """Write step_N.tmp, then manifest.json (every file's size and sha256) LAST, then rename it to
    step_N (replacing an older step_N: a run resumed from an earlier checkpoint re-saves it).
    A full disk removes the partial .tmp and raises OSError "disk full"; older checkpoints stay."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    RANK, WORLD = _rank_world()
    final = out / "checkpoints" / f"step_{run.step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    try:
        if RANK == 0:
            for stale in final.parent.glob("step_*.tmp"):  # a crash mid-save leaves these
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        for name in run.cfg.adapters + (["critic"] if run.critic else []):
            lora.save_adapter(run.model, name, tmp / "adapters" / name, base_model_name_or_path=hub_id(run.cfg.model.spec))
        # An optimizer that has not stepped yet (a role still frozen, outside its train window, or with no signal so
        # far) is saved as None: get_optimizer_state_dict would initialise it with a zero step at lr 0 (AdamW's
        # step = 1), which makes its first real step ~26% smaller and the run depend on save_freq. Every rank
        # steps the same adapters, so every rank takes the same branch (the collectives stay matched).
        opt_states = {n: get_optimizer_state_dict(run.model, o, options=StateDictOptions(full_state_dict=True,
                                                                                         cpu_offload=True))
                      if o.state else None for n, o in run.opts.items()}
        per_rank = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "engine": run.engine.state_dict() if hasattr(run.engine, "state_dict") else None,
                    "critic": run.critic.state_dict() if run.critic else None}  # the critic's optimizer is per-rank
        every = [per_rank] if WORLD == 1 else [None] * WORLD
        if WORLD > 1:  # rank 0 writes every rank's states: only rank 0 made step_N.tmp, and a rank's own disk may
            dist.all_gather_object(every, per_rank)  # not be rank 0's (rank-local output directories)
        if RANK == 0:
            for r, states in enumerate(every):
                torch.save(states, tmp / f"rng_rank{r}.pt")
            torch.save({"step": run.step, "cursor": run.cursor, "wandb_id": run.wandb_id, "kl": run.kl_ctrl.state_dict(),
                        "estimators": {n: e.state_dict() for n, e in run.estimator_state.items()},
                        "optim": opt_states, "sched": {n: s.state_dict() for n, s in run.scheds.items()},
                        "world_size": _rank_world()[1], "sharded": sharded(run.model)}, tmp / "trainer_state.pt")
            (tmp / "config.json").write_text(json.dumps(to_dict(run.cfg), indent=2))
            run.tok.save_pretrained(tmp / "tokenizer")  # with its chat template: the adapters travel with it
        _barrier()
        if RANK == 0:
            files = {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
                     for p in sorted(tmp.rglob("*")) if p.is_file()}
            (tmp / "manifest.json").write_text(json.dumps({"step": run.step, "files": files}, indent=1))
    except Exception as e:  # torch.save and safetensors wrap ENOSPC in their own errors
        if RANK == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e) or "os error 28" in str(e):
            raise OSError(errno.ENOSPC, f"disk full while saving checkpoint {final} (removed the partial copy; the "
                          "previous checkpoints are intact): free space, then resume") from e
        raise
    if RANK == 0:
        if final.exists():  # re-saving a step after resuming from an older checkpoint
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in ckpt_dirs(out)[:-run.cfg.trainer.keep_checkpoints]:
            remove_checkpoint(old)
    _barrier()


def remove_checkpoint(ckpt: Path):
    """Rotation: delete what the checkpoint owns, its manifest first (a rotation cut short leaves no checkpoint
    that looks whole), and keep whatever else its folder holds: eval.py's default <checkpoint>/eval results,
    train.py --trainer.eval-only's eval_metrics.json. The folder goes once empty."""
    owns = checkpoint_owns(ckpt)
    (ckpt / "manifest.json").unlink(missing_ok=True)
    for name in sorted(owns):
        p = ckpt / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    try:
        ckpt.rmdir()
    except OSError:  # not empty: results written into it stay
        pass


def hub_id(spec: str) -> str:
    """What adapters name as their base: the hub id of a preset, else the spec itself."""
    return {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}.get(spec, spec)


def check_checkpoint(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from (naming the file), or None if it is complete and sound:
    the manifest lists every file with its size and sha256, the states load, adapters are finite."""
    from safetensors.torch import load_file

    man = ckpt / "manifest.json"
    if not man.is_file():
        return f"{man} is missing (the save did not finish)"
    try:
        files = json.loads(man.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError) as e:
        return f"{man} is unreadable ({e})"
    for rel, meta in files.items():
        p = ckpt / rel
        if not p.is_file():
            return f"{p} is missing"
        if p.stat().st_size != meta["size"]:
            return f"{p} has {p.stat().st_size} bytes, the manifest says {meta['size']} (truncated?)"
        if _sha256(p) != meta["sha256"]:
            return f"{p} does not match its checksum"
    for p in [ckpt / "trainer_state.pt", *sorted(ckpt.glob("rng_rank*.pt"))]:
        try:
            torch.load(p, weights_only=False)
        except Exception as e:  # noqa: BLE001
            return f"{p} does not load ({type(e).__name__})"
    adapters = sorted((ckpt / "adapters").glob("*")) if (ckpt / "adapters").is_dir() else []
    for p in [ckpt / "config.json", *(d / "adapter_config.json" for d in adapters)]:
        try:
            if not isinstance(json.loads(p.read_text()), dict):
                return f"{p} is not a JSON object"
        except (ValueError, OSError) as e:
            return f"{p} is unreadable ({type(e).__name__})"
    if not adapters:
        return f"{ckpt / 'adapters'} has no adapter"
    for d in adapters:
        try:
            bad = [k for k, v in load_file(str(d / "adapter_model.safetensors")).items() if not torch.isfinite(v).all()]
        except Exception as e:  # noqa: BLE001
            return f"{d / 'adapter_model.safetensors'} does not load ({type(e).__name__})"
        if bad:
            return f"{d / 'adapter_model.safetensors'} holds NaN/inf in {bad[0]}"
    return None


def checkpoint_config(ckpt) -> Config:
    """For eval.py, play.py and export.py: the config of a checkpoint they are about to load, after the
    checks resume makes (check_checkpoint: manifest, sizes, checksums, states that load, finite
    adapters) and its config.json read and validated. A bad one ends the program with one line naming
    the file (SystemExit), never a traceback from deep inside torch or safetensors."""
    from config import from_dict

    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        why = f"{ckpt} is not a directory"
    elif not (ckpt / "manifest.json").exists() and not (ckpt / "trainer_state.pt").exists():  # a run, an adapter
        why = "not a checkpoint directory (no trainer_state.pt, no manifest.json); use a runs/X/checkpoints/step_N directory"
    else:
        why = check_checkpoint(ckpt)
    if why is None:
        try:
            cfg = from_dict(json.loads((ckpt / "config.json").read_text(encoding="utf-8")))
            cfg.validate()
            return cfg
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OSError) as e:
            why = f"{ckpt / 'config.json'} is not a config ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    raise SystemExit(f"error: {ckpt} cannot be loaded: {why}")


# what save_checkpoint writes into step_N besides what its manifest lists (and rng_rank*.pt): the checkpoint's own
CHECKPOINT_OWNS = ("adapters", "tokenizer", "config.json", "trainer_state.pt", "manifest.json")


def checkpoint_owns(ckpt: Path) -> set[str]:
    """The names in `ckpt` that are the checkpoint's (a folder eval.py made in it, eval/, is not)."""
    owns = set(CHECKPOINT_OWNS) | {p.name for p in ckpt.glob("rng_rank*")}
    try:
        owns |= {f.split("/")[0] for f in json.loads((ckpt / "manifest.json").read_text())["files"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no or a bad manifest: the fixed names still hold
    return owns


def check_out(out: Path, flag: str = "--out"):
    """For eval.py's and export.py's output folder: one line (SystemExit) unless `out` can hold files without
    harming anything: not an existing file, under a folder (not a file), and not the root of a checkpoint nor
    inside what the checkpoint owns."""
    def fail(msg):
        raise SystemExit(f"error: {flag} {out}{msg}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        fail(" is a file, not a directory")
    up = next(a for a in [out, *out.parents] if a.exists())
    if not up.is_dir():
        fail(f": {up} is a file, not a directory")
    try:
        real = out.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        fail(f": {e}")
    for ck in [real, *real.parents]:
        if not ((ck / "manifest.json").is_file() or (re.fullmatch(r"step_\d+(\.tmp)?", ck.name)
                                                     and ck.parent.name == "checkpoints")):
            continue
        rel = real.relative_to(ck).parts
        if not rel or rel[0] in checkpoint_owns(ck) or rel[0].startswith("rng_rank"):
            fail(f" is inside the checkpoint {ck}" + (f" (its {rel[0]})" if rel else "") + ": files there would make "
                 "it unusable; use a new folder in it (eval.py's default <checkpoint>/eval) or outside it")


def load_checkpoint(run, ckpt: Path):
    """Restore what save_checkpoint wrote, except the adapters: those are loaded into the plain
    model before sharding (load_adapters). On another number of ranks than the checkpoint's, each
    rank takes rank 0's RNG states (the data cursor is global; the run continues, not bit-exactly)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    RANK, WORLD = _rank_world()
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    run.step, run.cursor, run.wandb_id = state["step"], state["cursor"], state.get("wandb_id")
    for n, o in run.opts.items():
        if n not in state["optim"]:  # trainable now, frozen (or absent) when saved (trainer.resume_if_changed)
            if RANK == 0:
                print(f"note: {ckpt} holds no optimizer of adapter {n} (not trained when saved): it starts afresh",
                      flush=True)
            continue
        if state["optim"][n] is not None:  # None: it had not stepped (save_checkpoint), so it stays fresh
            set_optimizer_state_dict(run.model, o, optim_state_dict=state["optim"][n],
                                     options=StateDictOptions(full_state_dict=True))
        run.scheds[n].load_state_dict(state["sched"][n])
        if state["optim"][n] is None:  # the schedule may have moved (steps skipped as non-finite): its lr, as saved
            for g, lr in zip(o.param_groups, run.scheds[n].get_last_lr()):
                g["lr"] = lr
    run.kl_ctrl.load_state_dict(state["kl"])
    for n, d in state.get("estimators", {}).items():
        if n in run.estimator_state:
            run.estimator_state[n].load_state_dict(d)
    same_world = state.get("world_size", WORLD) == WORLD
    # the critic's optimizer state is saved per rank as it is: FSDP2's shards or a replicated model's whole tensors
    same_layout = same_world and state.get("sharded", sharded(run.model)) == sharded(run.model)
    rng = torch.load(ckpt / f"rng_rank{RANK if same_world else 0}.pt", weights_only=False)
    if not same_world and RANK == 0:
        print(f"note: {ckpt} was written by {state['world_size']} rank(s), resuming on {WORLD}: RNG states from "
              "rank 0" + (", the critic's optimizer starts fresh" if run.critic else ""), flush=True)
    elif not same_layout and run.critic and RANK == 0:
        was = "sharded (FSDP2)" if state["sharded"] else "replicated"
        print(f"note: {ckpt} was written {was}, resuming {'replicated' if state['sharded'] else 'sharded (FSDP2)'} "
              "(trainer.strategy): the critic's optimizer starts fresh", flush=True)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if rng["engine"] is not None and hasattr(run.engine, "load_state_dict"):
        run.engine.load_state_dict(rng["engine"])
    if run.critic:
        if same_layout:
            run.critic.load_state_dict(rng["critic"])
        else:
            run.critic.head.load_state_dict(rng["critic"]["head"])


def load_adapters(model, ckpt: Path, names):
    """Load each adapter (lora.load_adapter refuses one holding NaN/inf, naming the file and tensor); a checkpoint
    that lacks one of `names` (another config's roles) is one ConfigError."""
    if lacks := [n for n in names if not (ckpt / "adapters" / n).is_dir()]:
        held = sorted(p.name for p in (ckpt / "adapters").iterdir()) if (ckpt / "adapters").is_dir() else []
        raise ConfigError(f"{ckpt} holds no adapter {', '.join(lacks)} (it holds {', '.join(held) or 'none'}): a "
                          "checkpoint of another config's roles")
    for name in names:
        lora.load_adapter(model, name, ckpt / "adapters" / name)


def resolve_resume(cfg: Config, out: Path) -> Path | None:
    """The checkpoint to resume from: resume=auto takes the newest sound one (saying which it
    skipped and why), a path must be sound, none is none. Under torchrun rank 0's choice is the run's:
    every rank checks it sees that same checkpoint, sound (the ranks load it each from its own disk),
    and a rank that does not (an output directory on a rank-local disk, not a shared filesystem) stops
    every rank with one line from rank 0 naming it."""
    RANK, WORLD = _rank_world()
    if WORLD == 1:
        return _resolve_resume(cfg, out)
    try:
        mine = _resolve_resume(cfg, out) if RANK == 0 else None
        err = None
    except ConfigError as e:
        mine, err = None, str(e)
    decided = [(str(mine) if mine else None, err)]
    dist.broadcast_object_list(decided, src=0)
    path, err = decided[0]
    ckpt = Path(path) if path else None
    sees = [None] * WORLD
    dist.all_gather_object(sees, err is None and (ckpt is None or check_checkpoint(ckpt) is None))
    if err is None and all(sees):
        return ckpt
    if RANK != 0:
        raise SystemExit(1)  # rank 0 says why, once
    if err is not None:
        raise ConfigError(err)
    blind = [r for r, ok in enumerate(sees) if not ok]
    raise ConfigError(f"config field trainer.output_dir: rank 0 resumes from {ckpt.resolve()}, which rank(s) {blind} do "
                      f"not see (or see incomplete): every rank must read the run directory {out} on one shared filesystem; "
                      "put it on one, or start fresh with --trainer.resume none and a new --trainer.output-dir")


def _resolve_resume(cfg: Config, out: Path) -> Path | None:
    r = cfg.trainer.resume
    if r == "none":
        return None
    if r != "auto":
        mine = (out / "checkpoints").resolve()  # a symlinked checkpoints folder is still this run's
        own = mine in Path(r).resolve().parents or Path(r).resolve() in {p.resolve() for p in ckpt_dirs(out)}
        if not own and not cfg.trainer.eval_only and (ckpt_dirs(out) or (out / "metrics.jsonl").exists()):
            raise ConfigError(f"config field trainer.resume: {r} is another run's checkpoint, and {out} holds a run of "
                              "its own (its log and checkpoints would be cut back to that step and replaced): "
                              "--trainer.resume auto continues this run; another --trainer.output-dir starts one from "
                              f"{r}")
        why = check_checkpoint(Path(r))
        if why:
            raise ConfigError(f"config field trainer.resume: {r} cannot be resumed from: {why}")
        return Path(r)
    for ckpt in reversed(ckpt_dirs(out)):
        why = check_checkpoint(ckpt)
        if why is None:
            return ckpt
        if _rank_world()[0] == 0:
            print(f"skipping checkpoint {ckpt}: {why}", flush=True)
    return None


class Logger:
    """metrics.jsonl (always: resume and compare.py read it) + the trainer.logger sinks (console lines,
    wandb, TensorBoard event files under <run>/tensorboard) on rank 0; other ranks' calls are no-ops."""

    def __init__(self, run, out: Path):
        self.path, self.wandb, self.tb = out / "metrics.jsonl", None, None
        self.console = "console" in run.cfg.trainer.logger
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
        (out / "config.json").write_text(json.dumps(to_dict(run.cfg), indent=1))  # readable before any checkpoint
        if "wandb" in run.cfg.trainer.logger:
            import wandb
            run.wandb_id = run.wandb_id or uuid.uuid4().hex[:8]  # saved in checkpoints: a resume continues it
            self.wandb = wandb.init(project=run.cfg.trainer.wandb_project, dir=str(out), config=to_dict(run.cfg),
                                    name=out.name, id=run.wandb_id, resume="allow")
        if "tensorboard" in run.cfg.trainer.logger:  # `tensorboard --logdir runs/`; a resume drops the events past its step
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(out / "tensorboard"), purge_step=run.step + 1 if run.step else None)

    def log(self, step, metrics: dict, console: str | None = None):
        if not self.rank0:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if console and self.console:
            print(console, flush=True)

    def episodes(self, step, records: list[dict], n: int = 4):
        """wandb: a table of the first n episodes of this eval, one row per turn."""
        if self.wandb is None:
            return
        import wandb
        rows = [[step, r["task_id"], t["role"], t["prompt"][-2000:], t["reply"], t["reward"]] for r in records[:n]
                for t in r["turns"]]
        self.wandb.log({"val/episodes": wandb.Table(columns=["step", "task_id", "role", "prompt", "reply", "reward"],
                                                    data=rows)}, step=step)

    def plot(self, out: Path, roles):
        if not self.rank0 or not self.path.exists():
            return
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = [json.loads(ln) for ln in self.path.read_text().splitlines() if ln]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, prefix in zip(axes, ("train", "val")):
            for r, key in [(r, f"{prefix}/reward/{r}") for r in roles] + [("team", f"{prefix}/team_reward")]:
                pts = [(x["step"], x[key]) for x in rows if key in x]
                if pts:  # markers: a series of one point still shows
                    ax.plot(*zip(*pts), marker="o", label=r, **({"color": "black", "ls": "--"} if r == "team" else {}))
            low = min([0.0] + [y for ln in ax.get_lines() for y in ln.get_ydata()])  # rewards may go below 0 (a +-1 judge)
            ax.set(title=f"{prefix} reward per role", xlabel="step", ylim=(low - 0.05, 1.05))
            if ax.get_lines():
                ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "rewards.png", dpi=100)
        plt.close(fig)


def duration(seconds: float) -> str:
    """7s, 3m05s, 2h10m."""
    s = round(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt(m: dict, prefix: str, show: tuple[str, ...] = ()) -> str:
    """The console line of a step's or an eval's metrics: each role's reward, the team reward, the KL,
    clipfrac, entropy, skipped steps, then `show`: more metric names (the workflow module's CONSOLE
    tuple and trainer.console), each printed when `{prefix}/{name}` is among the metrics."""
    parts = [f"{k.split('/')[-1]} {v:.3f}" for k, v in m.items() if k.startswith(f"{prefix}/reward/")]
    for k in ("team_reward", "kl") + tuple(show):
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

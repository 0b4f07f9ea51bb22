"""Checkpoints that never load garbage and never lose a line: manifest checks and fallback,
NaN adapters refused, torn metrics lines, resuming an older checkpoint, a full disk."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import train
from config import load_config_file

ROOT = Path(__file__).resolve().parent.parent
# one worker runs this file: its module fixture (a trained run every test copies) is then built once
pytestmark = pytest.mark.xdist_group("rundir")


def cfg_for(out, **trainer):
    cfg = load_config_file(str(ROOT / "configs" / "tiny_toy.py"))
    kw = dict(output_dir=str(out), total_steps=3, save_freq=1, keep_checkpoints=3, resume="auto") | trainer
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **kw))


def steps_of(out):
    return [json.loads(x)["step"] for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def _run3(tmp_path_factory):
    out = tmp_path_factory.mktemp("run3") / "run"
    train.main(cfg_for(out))
    return out


@pytest.fixture
def run3(_run3, tmp_path):
    """A finished 3-step run with a checkpoint at every step, each test's own copy (trained once a module:
    output_dir is not part of what a resume compares)."""
    shutil.copytree(_run3, tmp_path / "run")
    return tmp_path / "run"


def ck(run, n):
    return run / "checkpoints" / f"step_{n:06d}"


def truncate(p: Path):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def put_nan(p: Path):
    t = load_file(str(p))
    k = sorted(t)[0]
    t[k][0, 0] = float("nan")
    save_file(t, str(p), metadata={"format": "pt"})


CORRUPTIONS = {
    "truncated trainer_state.pt": lambda c: truncate(c / "trainer_state.pt"),
    "truncated adapter": lambda c: truncate(c / "adapters" / "speaker" / "adapter_model.safetensors"),
    "missing rng file": lambda c: (c / "rng_rank0.pt").unlink(),
    "missing adapter dir": lambda c: __import__("shutil").rmtree(c / "adapters" / "speaker"),
    "NaN in an adapter": lambda c: put_nan(c / "adapters" / "speaker" / "adapter_model.safetensors"),
    "no manifest": lambda c: (c / "manifest.json").unlink(),
    # the manifest agreeing (rewritten after the edit): the checks read the JSON files themselves
    "garbage config.json": lambda c: ((c / "config.json").write_text("{not json"), remanifest(c)),
    "garbage adapter_config.json": lambda c: ((c / "adapters" / "speaker" / "adapter_config.json").write_text("{r: "),
                                              remanifest(c)),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_auto_resume_skips_a_bad_checkpoint_and_says_why(run3, name, capsys):
    CORRUPTIONS[name](ck(run3, 3))
    capsys.readouterr()
    train.main(cfg_for(run3, total_steps=4))
    out = capsys.readouterr().out
    assert f"skipping checkpoint {ck(run3, 3)}:" in out and f"resumed from {ck(run3, 2)}" in out
    assert steps_of(run3) == [1, 2, 3, 4]  # step 3 redone from step 2, its old line replaced
    assert not list((run3 / "checkpoints").glob("*.tmp"))


def remanifest(c: Path):
    """Rewrite the manifest to match the files: what a NaN that training itself produced would look like."""
    from rundir import _sha256
    man = json.loads((c / "manifest.json").read_text())
    man["files"] = {k: {"size": (c / k).stat().st_size, "sha256": _sha256(c / k)} for k in man["files"]}
    (c / "manifest.json").write_text(json.dumps(man))


def test_an_explicit_bad_checkpoint_is_a_clear_error(run3):
    put_nan(ck(run3, 2) / "adapters" / "speaker" / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"step_000002 cannot be resumed from: .*does not match its checksum"):
        train.main(cfg_for(run3, total_steps=4, resume=str(ck(run3, 2))))
    remanifest(ck(run3, 2))
    with pytest.raises(ValueError, match=r"step_000002 cannot be resumed from: .*NaN/inf"):
        train.main(cfg_for(run3, total_steps=4, resume=str(ck(run3, 2))))
    from rundir import load_adapters
    from model import load_model
    with pytest.raises(ValueError, match=f"{ck(run3, 2)}/adapters/speaker/adapter_model.safetensors: tensor .* holds NaN/inf"):
        load_adapters(load_model("tiny")[0], ck(run3, 2), ["speaker"])


# what eval.py, play.py and export.py once gave on these: a SafetensorError without the file's name, a
# bare JSONDecodeError, a PytorchStreamReader error; export.py merged a NaN adapter and wrote the model
ENTRY_CORRUPTIONS = {
    **CORRUPTIONS,
    "config.json of the wrong shape": lambda c: ((c / "config.json").write_text('{"trainer": 3}'), remanifest(c)),
    "NaN in an adapter, manifest rewritten": lambda c: (put_nan(c / "adapters" / "speaker" / "adapter_model.safetensors"),
                                                        remanifest(c)),
    "truncated adapter, manifest rewritten": lambda c: (truncate(c / "adapters" / "speaker" / "adapter_model.safetensors"),
                                                        remanifest(c)),
}


def test_eval_play_and_export_check_a_checkpoint_as_resume_does(run3, tmp_path):
    """Every entry point that loads a checkpoint gives one line naming the bad file (and writes nothing)."""
    import eval as eval_
    import export
    import play
    for name, corrupt in ENTRY_CORRUPTIONS.items():
        c = tmp_path / name.replace(" ", "_") / "step_000003"
        shutil.copytree(ck(run3, 3), c)
        corrupt(c)
        for label, call in (("eval", lambda: eval_.main(["--checkpoint", str(c), "--out", str(tmp_path / "ev")])),
                            ("play", lambda: play.main(["What is 2 + 2?", "--checkpoint", str(c)])),
                            ("export", lambda: export.export(c, tmp_path / "exported"))):
            with pytest.raises(SystemExit) as e:
                call()
            msg = str(e.value.code)
            assert msg.startswith(f"error: {c} cannot be loaded: {c}") and "\n" not in msg, (name, label, msg)
        assert not (tmp_path / "exported").exists() and not (tmp_path / "ev").exists()
    for wrong in (run3, ck(run3, 3) / "adapters" / "speaker"):  # a run directory, an adapter directory: what they are
        with pytest.raises(SystemExit, match=f"error: {wrong} cannot be loaded: not a checkpoint directory .no "
                                             "trainer_state.pt, no manifest.json.; use a runs/X/checkpoints/step_N"):
            eval_.main(["--checkpoint", str(wrong), "--out", str(tmp_path / "ev")])
    r = subprocess.run([os.sys.executable, "export.py", "--checkpoint", str(c), "--out", str(tmp_path / "x")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr[-2000:]


def test_a_torn_metrics_line_does_not_stop_a_resume(run3):
    with open(run3 / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "train/rew')  # SIGKILL mid-write
    train.main(cfg_for(run3, total_steps=4))
    assert steps_of(run3) == [1, 2, 3, 4]
    assert not (run3 / "metrics.jsonl.tmp").exists()


def test_resuming_an_older_checkpoint_while_newer_exist(run3):
    train.main(cfg_for(run3, total_steps=3, resume=str(ck(run3, 1))))
    assert steps_of(run3) == [1, 2, 3]
    assert sorted(p.name for p in (run3 / "checkpoints").iterdir()) == ["step_000001", "step_000002", "step_000003"]
    from rundir import check_checkpoint
    assert all(check_checkpoint(ck(run3, n)) is None for n in (1, 2, 3))


def test_steps_order_by_number_and_another_runs_checkpoint_never_cuts_this_run_back(run3, tmp_path):
    """A hand-made step_2 (not zero-padded) is older than step_000003, not the newest by name: the auto-resume takes
    step 3 and goes on. An explicit resume from another run's checkpoint into a directory that holds a run of its
    own is refused in one line, the run untouched (it cut the log back and rotated this run's checkpoints away);
    into an empty directory it is how a run is forked."""
    from config import ConfigError
    from rundir import ckpt_dirs
    shutil.copytree(ck(run3, 2), run3 / "checkpoints" / "step_2")
    (run3 / "checkpoints" / "step_\u00b2").mkdir()  # a digit to str.isdigit, not to int()
    assert [p.name for p in ckpt_dirs(run3)] == ["step_000001", "step_000002", "step_2", "step_000003"]
    train.main(cfg_for(run3, total_steps=4, keep_checkpoints=5))
    assert steps_of(run3) == [1, 2, 3, 4]
    other = tmp_path / "other"
    shutil.copytree(run3, other)
    before = {p: p.read_bytes() for p in sorted(run3.rglob("*")) if p.is_file() and p.name != ".lock"}
    with pytest.raises(ConfigError, match=f"config field trainer.resume: {ck(other, 2)} is another run's checkpoint, "
                                          f"and {run3} holds a run of its own .* --trainer.resume auto continues"):
        train.main(cfg_for(run3, total_steps=3, resume=str(ck(other, 2))))
    assert {p: p.read_bytes() for p in sorted(run3.rglob("*")) if p.is_file() and p.name != ".lock"} == before
    train.main(cfg_for(run3, total_steps=3, resume=str(ck(other, 2)), eval_only=True))  # reads it, cuts nothing
    assert steps_of(run3) == [1, 2, 3, 4]
    train.main(cfg_for(tmp_path / "fork", total_steps=3, resume=str(ck(other, 2))))  # a fresh directory: a fork
    assert steps_of(tmp_path / "fork") == [3]
    shutil.move(other / "checkpoints", tmp_path / "elsewhere")  # checkpoints on another disk, through a link:
    (other / "checkpoints").symlink_to(tmp_path / "elsewhere")  # an older one of its own run resumes
    train.main(cfg_for(other, total_steps=3, resume=str(ck(other, 2))))
    assert steps_of(other) == [1, 2, 3]


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        run = mnt / "run"
        cfg = cfg_for(run, total_steps=1)
        train.main(cfg)  # step 1 fits
        ballast = mnt / "ballast"
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        ballast.write_bytes(b"x" * max(0, free - 200_000))  # leave too little for another checkpoint
        with pytest.raises(OSError, match="disk full while saving checkpoint"):
            train.main(cfg_for(run, total_steps=2))
        ballast.unlink()
        from rundir import check_checkpoint
        assert check_checkpoint(ck(run, 1)) is None and not list((run / "checkpoints").glob("*.tmp"))
        train.main(cfg_for(run, total_steps=2))  # space again: the run goes on from step 1
        assert steps_of(run)[-1] == 2
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_checkpoints_carry_a_manifest_the_tokenizer_and_the_real_base(run3):
    man = json.loads((ck(run3, 3) / "manifest.json").read_text())
    assert "trainer_state.pt" in man["files"] and "adapters/speaker/adapter_model.safetensors" in man["files"]
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(ck(run3, 3) / "tokenizer").chat_template
    from rundir import hub_id
    assert hub_id("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert torch.load(ck(run3, 3) / "trainer_state.pt", weights_only=False)["world_size"] == 1


def test_resume_on_another_number_of_ranks_and_another_strategy(tmp_path):
    """1 rank -> 2 ranks sharded -> 2 ranks replicated -> 1 rank, with GAE's critic, whose optimizer state is
    saved per rank in the layout it had (FSDP2's shards, or whole tensors): where the ranks or the layout
    changed it starts fresh, with a note, instead of loading shards into whole parameters."""
    import sys
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    base = ["--config", str(ROOT / "configs" / "tiny_toy.py"), "--trainer.output-dir", str(tmp_path / "run"),
            "--trainer.save-freq", "1", "--algo.mini-batch-size", "64", "--algo.adv-estimator", "gae"]
    one = [sys.executable, str(ROOT / "train.py")]
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29549",
           str(ROOT / "train.py")]
    outs = []
    for cmd, steps, extra in ((one, 1, []), (two, 2, []), (two, 3, ["--trainer.strategy", "replicate"]), (one, 4, [])):
        r = subprocess.run(cmd + base + ["--trainer.total-steps", str(steps), *extra], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        outs.append(r.stdout)
    assert steps_of(tmp_path / "run") == [1, 2, 3, 4]
    assert "written by 1 rank(s), resuming on 2" in outs[1] and "written by 2 rank(s), resuming on 1" in outs[3]
    assert "written sharded (FSDP2), resuming replicated (trainer.strategy): the critic's optimizer starts fresh" \
        in outs[2]
    assert "| 2 rank(s), FSDP2" in outs[1] and "| 2 rank(s), replicated" in outs[2]


def test_the_console_line_shows_the_workflows_and_the_configs_metrics(tmp_path, capsys):
    """A workflow module's CONSOLE names and trainer.console reach the console line; rundir is not edited."""
    import train
    from config import load_config_file
    from envs import math_3agent
    from rundir import fmt
    assert "evaluator_fpr" in math_3agent.CONSOLE
    m = {"train/reward/g": 0.5, "train/evaluator_fpr": 0.25, "train/evaluator_recall": 0.75}
    assert "evaluator_fpr 0.250" in fmt(m, "train", math_3agent.CONSOLE) and "recall" not in fmt(m, "train")
    cfg = load_config_file(str(Path(__file__).resolve().parent.parent / "configs" / "tiny_math_3agent.py"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / "run"), total_steps=1,
                                                               save_freq=0, test_freq=0, val_before_train=False,
                                                               resume="none", console=("evaluator_recall",)))
    train.main(cfg)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("[step 1/1]"))
    assert "evaluator_balanced_acc" in line and "evaluator_fpr" in line and "evaluator_recall" in line


def test_a_run_directory_in_use_is_refused_with_its_holder_and_a_dead_holder_blocks_nothing(run3, tmp_path):
    """Two train.py in one run directory both ran, every metrics line doubled. The run directory is locked: a
    second process is refused with one line naming the holder (pid, host, start); the lock is an flock, dropped by
    the kernel when its holder dies, so the lock file a kill -9'd run leaves (naming a dead pid) blocks nothing."""
    import socket
    from rundir import DirLock
    log = (run3 / "metrics.jsonl").read_bytes()
    cmd = [sys.executable, "train.py", "--config", "configs/tiny_toy.py", "--trainer.output-dir", str(run3),
           "--trainer.total-steps", "4", "--trainer.save-freq", "1", "--trainer.keep-checkpoints", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with DirLock(run3, "a test"):  # a real holder: this process
        assert DirLock(run3, "the same process").held  # its own lock, taken again
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"error: {run3} is in use by a test (pid {os.getpid()} on {socket.gethostname()}, since ")
    assert (run3 / "metrics.jsonl").read_bytes() == log and not ck(run3, 4).exists()  # nothing touched
    holder = subprocess.run([sys.executable, "-c", "import os, sys; from rundir import DirLock; "
                             "lock = DirLock(sys.argv[1], 'a killed run'); os.kill(os.getpid(), 9)", str(run3)],
                            cwd=ROOT, env=env)
    assert holder.returncode == -9 and "a killed run" in (run3 / ".lock").read_text()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert steps_of(run3) == [1, 2, 3, 4]  # resumed once, each step logged once


def test_checkpoint_rotation_keeps_the_eval_results_written_into_a_checkpoint(run3):
    """Rotation rmtree'd the whole step_N folder, eval.py's default <checkpoint>/eval results with it. It deletes
    what the checkpoint owns (its manifest first) and keeps the rest; the folder left is no checkpoint."""
    import eval as eval_
    from rundir import check_checkpoint
    eval_.main(["--checkpoint", str(ck(run3, 1)), "--limit", "2"])
    (ck(run3, 2) / "eval_metrics.json").write_text("{}")  # what train.py --trainer.eval-only writes there
    results = (ck(run3, 1) / "eval" / "results.json").read_bytes()
    train.main(cfg_for(run3, total_steps=4, keep_checkpoints=2))  # rotates steps 1 and 2 out
    assert (ck(run3, 1) / "eval" / "results.json").read_bytes() == results
    assert sorted(p.name for p in ck(run3, 1).iterdir()) == ["eval"]
    assert sorted(p.name for p in ck(run3, 2).iterdir()) == ["eval_metrics.json"]
    assert "manifest.json is missing" in check_checkpoint(ck(run3, 2))
    assert check_checkpoint(ck(run3, 3)) is None and check_checkpoint(ck(run3, 4)) is None
    train.main(cfg_for(run3, total_steps=5, keep_checkpoints=2))  # and rotation goes on past the folders left
    assert not ck(run3, 3).exists() and check_checkpoint(ck(run3, 5)) is None and steps_of(run3) == [1, 2, 3, 4, 5]


WRAP = """import os, runpy, sys
os.chdir(os.path.join(sys.argv[1], "rank" + os.environ["LOCAL_RANK"]))  # each rank its own disk: relative paths differ
sys.path.insert(0, sys.argv[2])
sys.argv = [os.path.join(sys.argv[2], "train.py")] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_two_ranks_on_rank_local_directories_save_from_rank_0_and_refuse_the_resume_in_one_line(tmp_path):
    """Two ranks whose output directory is each its own (rank-local disks: a relative --trainer.output-dir under a
    different working directory per rank). Saving: rank 0 alone writes the checkpoint, every rank's RNG file in it
    (rank 1 wrote into a folder only rank 0 had made: a FileNotFoundError traceback); rank 1's disk gets no
    checkpoint. Resuming: rank 0's choice is the run's, and rank 1, which does not see it, stops the run with one
    line from rank 0 naming the shared filesystem it needs (each rank used to resolve the resume itself)."""
    (tmp_path / "wrap.py").write_text(WRAP)
    for r in (0, 1):
        (tmp_path / f"rank{r}").mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29551",
           str(tmp_path / "wrap.py"), str(tmp_path), str(ROOT), "--config", str(ROOT / "configs" / "tiny_toy.py"),
           "--trainer.output-dir", "run", "--trainer.save-freq", "1", "--algo.mini-batch-size", "64"]
    r = subprocess.run(cmd + ["--trainer.total-steps", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    ck = tmp_path / "rank0" / "run" / "checkpoints" / "step_000001"
    assert sorted(p.name for p in ck.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
    assert not list((tmp_path / "rank1").rglob("step_*"))
    states = [torch.load(ck / f"rng_rank{i}.pt", weights_only=False) for i in (0, 1)]
    assert all(set(s) >= {"python", "numpy", "torch"} for s in states)
    r = subprocess.run(cmd + ["--trainer.total-steps", "2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    errors = [x for x in (r.stdout + r.stderr).splitlines() if x.startswith("error: ")]
    assert r.returncode != 0 and len(errors) == 1, (r.stdout + r.stderr)[-3000:]
    assert "rank(s) [1] do not see" in errors[0] and "shared filesystem" in errors[0] and str(ck) in errors[0]
    import re
    assert not re.search(r'File ".*/(train|rundir|session|collectives)\.py"', r.stderr)  # torchrun's own report only
    assert steps_of(tmp_path / "rank0" / "run") == [1]  # nothing trained past the refusal

"""What a researcher sees of a run: progress bars and the ETA, the wandb episode table, the
trajectory viewer (console filters) and its static HTML page, rendered in real headless Chromium."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import trajectories

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real 3-role tiny run: 2 steps, eval at 0, 1 and 2, progress bars on, wandb offline."""
    out = tmp_path_factory.mktemp("view") / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny_math_3agent.py", "--trainer.output-dir",
                        str(out), "--trainer.total-steps", "2", "--trainer.test-freq", "1", "--trainer.save-freq", "0",
                        "--trainer.val-before-train", "--rollout.progress", "--data.val-size", "6",
                        "--trainer.trajectory-sample", "1.0", "--trainer.logger", "console", "wandb"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r.stdout, r.stderr


def test_progress_bars_and_eta(run):
    _, stdout, stderr = run
    assert "step 1 update" in stderr and "step 2 update" in stderr  # the update's bar, per step
    assert stderr.count("episodes") >= 5  # rollout bars: 2 steps + 3 evals
    steps = [ln for ln in stdout.splitlines() if ln.startswith("[step ")]
    assert len(steps) == 2 and all(" | ETA " in ln for ln in steps) and steps[-1].endswith("ETA 0s")


def test_progress_off_prints_no_bars(tmp_path):
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny_toy.py", "--trainer.output-dir",
                        str(tmp_path / "r"), "--trainer.total-steps", "1", "--rollout.no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0 and "update" not in r.stderr and "episodes:" not in r.stderr, r.stderr


def test_wandb_gets_a_table_of_episodes_per_eval(run):
    out, _, _ = run
    tables = sorted((out / "wandb").glob("offline-run-*/files/media/table/val/episodes_*.table.json"))
    assert len(tables) == 3, tables  # evals at steps 0, 1, 2
    t = json.loads(tables[-1].read_text())
    assert t["columns"] == ["step", "task_id", "role", "prompt", "reply", "reward"]
    val = trajectories.read(out / "trajectories" / "val_step_000002.jsonl")
    want = [[2, r["task_id"], x["role"], x["prompt"][-2000:], x["reply"], x["reward"]] for r in val[:4] for x in r["turns"]]
    assert t["data"] == want


def test_viewer_filters_episodes(run):
    out, _, _ = run
    records = trajectories.read(out / "trajectories")
    assert {r["split"] for r in records} == {"train", "val"} and {r["step"] for r in records} == {0, 1, 2}
    assert trajectories.select(records, step=1, split="val") == [r for r in records if r["step"] == 1 and r["split"] == "val"]
    evals = trajectories.select(records, role="evaluator_critique")
    assert evals and all(any(t["role"] == "evaluator_critique" for t in r["turns"]) for r in evals)
    hi = trajectories.select(records, min_reward=0.5)
    assert all(r["metrics"]["team_reward"] >= 0.5 for r in hi)
    assert len(hi) + len(trajectories.select(records, max_reward=0.49999)) == len(records)
    cli = subprocess.run([sys.executable, "trajectories.py", str(out), "--step", "2", "--split", "val", "--limit", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    n = len(trajectories.select(records, step=2, split="val"))
    assert cli.startswith(f"{n} of {len(records)} episodes match") and cli.count("(val step 2)") == 2
    bad = out.parent / "bad.jsonl"
    bad.write_text('{"split": "val"}\n{not json\n')
    err = subprocess.run([sys.executable, "trajectories.py", str(bad)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert err.returncode != 0 and "bad.jsonl:2" in err.stderr


def shown(dom: str) -> int:
    """Episodes the page rendered (its script's own source does not match: no digit after the quote)."""
    return len(re.findall(r'<details class="episode" data-role-reward="[-0-9]', dom))


def _chromium(*args, timeout=120):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Chromium (.ci/run installs Debian's chromium)")
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_html_page_renders_curves_and_filters_episodes_in_chromium(run, tmp_path):
    out, _, _ = run
    page = trajectories.write_html(out)
    records = trajectories.read(out / "trajectories")
    url = page.resolve().as_uri()
    r = _chromium(f"--user-data-dir={tmp_path / 'u1'}", "--dump-dom", url + "#split=val&step=2")
    dom = r.stdout
    assert shown(dom) == len(trajectories.select(records, step=2, split="val")) > 0, r.stderr[-2000:]
    assert f"of {len(records)} episodes" in dom
    for split in ("train", "val"):  # one curve per role and the team, per split
        for role in ("generator_initial", "evaluator_critique", "generator_refinement", "team"):
            assert f'data-split="{split}"' in dom and f'data-role="{role}"' in dom
    dom = _chromium(f"--user-data-dir={tmp_path / 'u2'}", "--dump-dom", url + "#role=evaluator_critique").stdout
    n = len(trajectories.select(records, role="evaluator_critique"))
    assert shown(dom) == n and f"{n} of {len(records)} episodes" in dom
    assert dom.count('<span class="role">generator_initial') == 0  # only the chosen role's turns are shown
    shot = tmp_path / "view.png"
    _chromium(f"--user-data-dir={tmp_path / 'u3'}", "--window-size=1100,900", f"--screenshot={shot}", url)
    from PIL import Image
    img = Image.open(shot).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20)
    assert img.size == (1100, 900) and len(colors) > 20  # drawn, not blank

"""Trajectory files: the one format train.py and eval.py write, and people (and SFT, analysis) read.

    runs/X/trajectories/train_step_000012.jsonl   a sample of step 12's training episodes
    runs/X/trajectories/val_step_000012.jsonl     every validation episode of the eval at step 12
    <checkpoint>/eval/...jsonl                    eval.py's generations

One JSON object per episode:
    {"split": "train" | "val" | ..., "step": 12, "task_id": 96, "episode_id": 3, "task": {...},
     "truncated": false, "error": null, "metrics": {"team_reward": 1.0, ...},
     "turns": [{"turn": 0, "role": "generator_initial", "prompt": "<chat-formatted text>",
                "reply": "...", "prompt_tokens": 87, "reply_tokens": 41, "finish_reason": "stop",
                "reward": 1.0, "advantage": 0.71, "baseline": null}, ...]}
`advantage` is the mean over the turn's trained tokens (null when the turn was not trained, e.g.
filtered by dynamic sampling, or in eval); `baseline` is ReMax's greedy reward for the turn.
Files are written whole (temp file + rename): a reader never sees half a file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def episode_record(ep, tok, split: str, step: int) -> dict:
    return {
        "split": split, "step": step, "task_id": ep.task_id, "episode_id": ep.episode_id,
        "task": ep.task, "truncated": ep.truncated, "error": ep.error, "metrics": ep.metrics,
        "turns": [{"turn": s.turn, "role": s.role, "prompt": tok.decode(s.prompt_ids),
                   "reply": s.info.get("text", tok.decode(s.completion_ids, skip_special_tokens=True)),
                   "prompt_tokens": len(s.prompt_ids), "reply_tokens": len(s.completion_ids),
                   "finish_reason": s.finish_reason, "reward": s.reward, "advantage": s.info.get("advantage"),
                   "baseline": s.info.get("baseline")} for s in ep.steps],
    }


def write(path, records: list[dict]):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
    os.replace(tmp, path)


def read(path) -> list[dict]:
    """Every record of a trajectory file (or of every *.jsonl under a directory, in name order)."""
    path = Path(path)
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    out = []
    for p in files:
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{i}: not a trajectory record ({e})") from None
    return out


def show(record: dict, width: int = 160) -> str:
    """A short, per-role rendering of one episode for the console."""
    lines = [f"task {record['task_id']} ({record['split']} step {record['step']}): "
             + str((record.get("task") or {}).get("question", ""))[:width]]
    for t in record["turns"]:
        reply = " ".join(t["reply"].split())
        lines.append(f"  [{t['role']}] reward {t['reward']:.2f}: {reply[:width]}")
    return "\n".join(lines)

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

The viewer (README "See what the agents said"):
    python trajectories.py runs/X [--step N] [--role R] [--split val] [--min-reward x] [--full]
    python trajectories.py runs/X --html          # runs/X/view.html: reward curves + episode browser
"""
from __future__ import annotations

import html
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
                   "baseline": s.info.get("baseline"),
                   **{k: s.info[k] for k in ("env_reward", "reward_components") if k in s.info}} for s in ep.steps],
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


# ------------------------------------------------------------------------------------- the viewer

def select(records: list[dict], step=None, role=None, split=None, min_reward=None, max_reward=None) -> list[dict]:
    """Episodes of `split` at `step` with a turn of `role` whose reward is within [min, max] (each
    filter optional; without `role` the reward filter reads the episode's team_reward, else its
    turns' mean reward)."""
    out = []
    for r in records:
        if (step is not None and r.get("step") != step) or (split is not None and r.get("split") != split):
            continue
        turns = [t for t in r["turns"] if role is None or t["role"] == role]
        if role is not None and not turns:
            continue
        rewards = [t["reward"] for t in turns if t.get("reward") is not None]
        w = (r.get("metrics") or {}).get("team_reward") if role is None else None
        if w is None:
            w = sum(rewards) / len(rewards) if rewards else 0.0
        if (min_reward is not None and w < min_reward) or (max_reward is not None and w > max_reward):
            continue
        out.append(r)
    return out


def _svg_curves(rows: list[dict], prefix: str, roles: list[str], w=500, h=240) -> str:
    """An inline SVG line chart of `<prefix>/reward/<role>` (and the team, dashed) over steps, 0-1 axis."""
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    series = [(r, f"{prefix}/reward/{r}", colors[i % len(colors)], "") for i, r in enumerate(roles)]
    series.append(("team", f"{prefix}/team_reward", "#000", "5,4"))
    steps = [x["step"] for x in rows if any(k in x for _, k, _, _ in series)]
    lo, hi = (min(steps), max(steps)) if steps else (0, 1)
    L, R, T, B = 40, 150, 24, 30
    sx = (lambda s: L + (w - L - R) * ((s - lo) / (hi - lo) if hi > lo else 0.5))
    sy = (lambda v: T + (h - T - B) * (1 - max(0.0, min(1.0, v))))
    el = [f'<svg class="curves" data-split="{prefix}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
          f'<text x="{L}" y="15" font-size="13" font-weight="bold">{prefix} reward per role</text>',
          f'<rect x="{L}" y="{T}" width="{w - L - R}" height="{h - T - B}" fill="none" stroke="#999"/>']
    for v in (0, 0.5, 1):
        el.append(f'<text x="{L - 6}" y="{sy(v) + 4:.1f}" font-size="10" text-anchor="end">{v:g}</text>')
    for s in sorted({lo, hi}):
        el.append(f'<text x="{sx(s):.1f}" y="{h - B + 14}" font-size="10" text-anchor="middle">{s}</text>')
    el.append(f'<text x="{(L + w - R) / 2:.0f}" y="{h - 4}" font-size="10" text-anchor="middle">step</text>')
    k = 0
    for name, key, color, dash in series:
        pts = [(x["step"], x[key]) for x in rows if key in x]
        if not pts:
            continue
        path = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in pts)
        el.append(f'<polyline class="series" data-role="{html.escape(name)}" points="{path}" fill="none" '
                  f'stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        el += [f'<circle cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="3" fill="{color}"/>' for s, v in pts]
        el.append(f'<text x="{w - R + 8}" y="{T + 12 + 14 * k}" font-size="11" fill="{color}">{html.escape(name)}</text>')
        k += 1
    return "\n".join(el + ["</svg>"])


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>troupe: {title}</title>
<style>
 body {{ font: 14px sans-serif; margin: 20px; color: #222; }} .charts {{ display: flex; gap: 24px; }}
 .controls {{ margin: 16px 0; }} .controls label {{ margin-right: 14px; }}
 details.episode {{ border: 1px solid #ccc; border-radius: 4px; margin: 6px 0; padding: 4px 8px; }}
 .turn {{ margin: 6px 0 6px 12px; }} .role {{ font-weight: bold; }} pre {{ white-space: pre-wrap; margin: 2px 0;
 background: #f6f6f6; padding: 4px; }} .prompt {{ color: #666; }} .good {{ color: #2a7; }} .bad {{ color: #c33; }}
</style></head><body>
<h2>{title}</h2>
<div class="charts">{charts}</div>
<div class="controls">
 <label>split <select id="split"><option value="">all</option></select></label>
 <label>step <select id="step"><option value="">all</option></select></label>
 <label>role <select id="role"><option value="">all</option></select></label>
 <label>min reward <input id="min" type="number" step="0.1" size="4"></label>
 <span id="count"></span>
</div>
<div id="episodes"></div>
<script id="data" type="application/json">{data}</script>
<script>
const EPS = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({{"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}}[c]));
function fill(id, values) {{
  for (const v of values) {{ const o = document.createElement("option"); o.value = o.textContent = v; $(id).appendChild(o); }}
}}
fill("split", [...new Set(EPS.map((e) => e.split))].sort());
fill("step", [...new Set(EPS.map((e) => e.step))].sort((a, b) => a - b));
fill("role", [...new Set(EPS.flatMap((e) => e.turns.map((t) => t.role)))].sort());
function score(e, role) {{
  const ts = e.turns.filter((t) => !role || t.role === role);
  if (!role && e.metrics && e.metrics.team_reward !== undefined) return e.metrics.team_reward;
  return ts.length ? ts.reduce((a, t) => a + (t.reward || 0), 0) / ts.length : 0;
}}
function render() {{
  const split = $("split").value, step = $("step").value, role = $("role").value, min = $("min").value;
  const shown = EPS.filter((e) => (!split || e.split === split) && (!step || String(e.step) === step)
    && (!role || e.turns.some((t) => t.role === role)) && (min === "" || score(e, role) >= Number(min)));
  $("count").textContent = shown.length + " of " + EPS.length + " episodes";
  $("episodes").innerHTML = shown.map((e) => {{
    const r = score(e, role);
    return '<details class="episode" data-role-reward="' + r + '"><summary>' + esc(e.split) + " step " + e.step
      + " · task " + e.task_id + " · " + '<span class="' + (r > 0.5 ? "good" : "bad") + '">reward ' + r.toFixed(2)
      + "</span> · " + esc(String((e.task || {{}}).question || (e.task || {{}}).prompt || "").slice(0, 120)) + "</summary>"
      + e.turns.filter((t) => !role || t.role === role).map((t) => '<div class="turn"><span class="role">' + esc(t.role)
        + "</span> reward " + (t.reward === null ? "-" : t.reward.toFixed(2))
        + (t.advantage === null || t.advantage === undefined ? "" : " · advantage " + t.advantage.toFixed(2))
        + " · " + t.reply_tokens + " tokens · " + esc(t.finish_reason)
        + '<pre class="prompt">' + esc(t.prompt.slice(-600)) + "</pre><pre>" + esc(t.reply) + "</pre></div>").join("")
      + "</details>";
  }}).join("");
}}
const q = new URLSearchParams(location.hash.slice(1));  // e.g. page.html#role=evaluator&min=0.5
for (const k of ["split", "step", "role", "min"]) if (q.has(k)) $(k).value = q.get(k);
for (const k of ["split", "step", "role", "min"]) $(k).addEventListener("input", render);
render();
if (q.has("open"))  // #open=2 expands the first two episodes shown
  [...document.querySelectorAll("details.episode")].slice(0, Number(q.get("open"))).forEach((d) => d.open = true);
</script></body></html>
"""


def write_html(run_dir, path=None, max_episodes: int = 300) -> Path:
    """A static page (no network, no server): per-role reward curves from metrics.jsonl and a
    browsable, filterable sample of the run's episodes (the newest `max_episodes`)."""
    run_dir = Path(run_dir)
    path = Path(path) if path else run_dir / "view.html"
    metrics = run_dir / "metrics.jsonl"
    rows = []
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line of a killed run
    tdir = run_dir / "trajectories"
    records = read(tdir) if tdir.is_dir() else []
    records = sorted(records, key=lambda r: (r.get("step", 0), r.get("split", "")))[-max_episodes:]
    roles = sorted({k.split("/", 2)[2] for x in rows for k in x if k.startswith(("train/reward/", "val/reward/"))}
                   | {t["role"] for r in records for t in r["turns"]})
    charts = _svg_curves(rows, "train", roles) + _svg_curves(rows, "val", roles)
    data = json.dumps(records, default=str).replace("</", "<\\/")  # no "</script>" inside the JSON
    path.write_text(PAGE.format(title=html.escape(str(run_dir)), charts=charts, data=data), encoding="utf-8")
    return path


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(allow_abbrev=False, description="Print a run's episodes, filtered, or write its static HTML page.")
    p.add_argument("path", help="a run directory (runs/X), its trajectories/ directory, or one .jsonl file")
    p.add_argument("--step", type=int)
    p.add_argument("--role")
    p.add_argument("--split", help="train, val, or eval.py's split names")
    p.add_argument("--min-reward", type=float)
    p.add_argument("--max-reward", type=float)
    p.add_argument("--limit", type=int, default=5, help="episodes to print (default 5)")
    p.add_argument("--full", action="store_true", help="whole prompts and replies, not one line per turn")
    p.add_argument("--html", nargs="?", const="", metavar="OUT",
                   help="write the static page (default <run>/view.html) instead of printing")
    a = p.parse_args(argv)
    path = Path(a.path)
    if a.html is not None:
        print(write_html(path, a.html or None))
        return
    if path.is_dir() and (path / "trajectories").is_dir():
        path = path / "trajectories"
    if not path.exists():
        raise SystemExit(f"error: {path} does not exist")
    try:
        records = read(path)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    chosen = select(records, a.step, a.role, a.split, a.min_reward, a.max_reward)
    print(f"{len(chosen)} of {len(records)} episodes match")
    for r in chosen[:a.limit]:
        if a.full:
            print(f"=== task {r['task_id']} ({r['split']} step {r['step']}) metrics {r.get('metrics')}")
            for t in r["turns"]:
                if a.role is None or t["role"] == a.role:
                    print(f"--- [{t['role']}] reward {t['reward']} · {t['reply_tokens']} tokens · {t['finish_reason']}\n"
                          f"{t['prompt']}\n>>> {t['reply']}")
        else:
            print(show(r))


if __name__ == "__main__":
    main()

"""Trajectory files: the one format train.py and eval.py write, and people (and SFT, analysis) read.

    runs/X/trajectories/train_step_000012.jsonl   a sample of step 12's training episodes
    runs/X/trajectories/val_step_000012.jsonl     every validation episode of the eval at step 12
    <checkpoint>/eval/...jsonl                    eval.py's generations

One JSON object per episode:
    {"split": "train" | "val" | ..., "step": 12, "task_id": 96, "episode_id": 3, "task": {...},
     "truncated": false, "error": null, "metrics": {"team_reward": 1.0, ...},
     "turns": [{"turn": 0, "role": "generator_initial", "prompt": "<chat-formatted text>",
                "prompt_ids": [1, 9690, ...], "reply": "...", "prompt_tokens": 87, "reply_tokens": 41, "finish_reason": "stop",
                "reward": 1.0, "advantage": 0.71, "baseline": null}, ...]}
`advantage` is the mean over the turn's trained tokens (a turn rollout.merge_turns joined with others:
the merged sequence's; null when the turn was not trained, e.g. filtered by dynamic sampling, or in
eval); `baseline` is ReMax's greedy reward for the turn; `tree_best` (rollout.tree_sampling only) whether the
turn's candidate was the one whose state went on in every chain of its task, and `env_error` what its env raised
(the candidate then earned 0). `prompt_ids` are the ids the role saw (the text
cannot tell a template's `<|im_end|>` from one a model wrote as characters; SFT reads the ids).
Files are written whole (temp file + rename): a reader never sees half a file. `read` opens regular
files only, up to MAX_FILE_BYTES (a FIFO named x.jsonl would hang it, a link to /dev/zero fill the
memory), and checks every line (check_record: UTF-8, JSON, text without lone surrogates, and the type
and range of every field above that a reader uses); a bad one is a TrajectoryError naming file:line
and the field, which every reader (this viewer, sft.py, rewards/calculator.py, compare.py) prints as
one line.

The viewer (docs/tools.md):
    python trajectories.py runs/X [--step N] [--role R] [--split val] [--min-reward x] [--full]
    python trajectories.py runs/X --html          # runs/X/view.html: reward curves + episode browser
The page embeds the records as JSON with every '<', '>' and '&' escaped, and its script puts each
field into the page as text (never as HTML), whatever a model wrote or a crafted file holds.
"""
from __future__ import annotations

import html
import json
import math
import os
import stat
from pathlib import Path


def episode_record(ep, tok, split: str, step: int) -> dict:
    return {
        "split": split, "step": step, "task_id": ep.task_id, "episode_id": ep.episode_id,
        "task": ep.task, "truncated": ep.truncated, "error": ep.error, "metrics": ep.metrics,
        "turns": [{"turn": s.turn, "role": s.role, "prompt": tok.decode(s.prompt_ids), "prompt_ids": list(s.prompt_ids),
                   "reply": s.text or tok.decode(s.completion_ids, skip_special_tokens=True),
                   "prompt_tokens": len(s.prompt_ids), "reply_tokens": len(s.completion_ids),
                   "finish_reason": s.finish_reason, "reward": s.reward, "advantage": s.advantage,
                   "baseline": s.baseline,
                   **{k: getattr(s, k) for k in ("env_reward", "reward_components") if getattr(s, k) is not None},
                   **{k: s.info[k] for k in ("tree_best", "env_error") if k in s.info}}
                  for s in ep.samples],
    }


def write(path, records: list[dict]):
    write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def write_text(path, text: str):
    """`text` into `path` whole or not at all (a temp file, then a rename): a kill or a full disk mid-write
    leaves the old file (or none), never a torn one. Trajectory files, recipes.py's markers and summary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class TrajectoryError(ValueError):
    """A trajectory file or line that is not a usable record; the message names file:line and the field."""


MAX_FILE_BYTES = 1 << 30  # 1 GiB: far above any run's trajectory file; a file past it is refused, not read
MAX_COUNT = 1 << 53  # token counts, turn and step numbers: integers a float (and JavaScript) holds exactly


def read_bytes(path, cap: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of `path` if it is a regular file (or a link to one) of at most `cap` bytes, else a
    TrajectoryError naming it. Opened without blocking and checked before reading: a FIFO, a device
    (a link to /dev/zero), a directory or a file grown past the cap is refused, never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait for a writer
    except OSError as e:
        raise TrajectoryError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or the like"
            raise TrajectoryError(f"{path}: not a regular file ({kind}); refused")
        size = os.fstat(fd).st_size  # the read is sized by the file, never by the cap: f.read(cap + 1) reserved
        if size > cap:                # 1 GiB for every file (MemoryError under `ulimit -v`)
            raise TrajectoryError(f"{path}: larger than {cap} bytes (trajectories.MAX_FILE_BYTES); refused")
        with os.fdopen(fd, "rb", closefd=False) as f:
            chunks = [f.read(size)]
            while chunk := f.read(1 << 20):  # it grew since fstat
                chunks.append(chunk)
                if sum(map(len, chunks)) > cap:
                    raise TrajectoryError(f"{path}: larger than {cap} bytes (trajectories.MAX_FILE_BYTES); refused")
    except OSError as e:
        raise TrajectoryError(f"{path}: cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _number(x) -> bool:
    """A finite int or float that converts to a float (a 400-digit integer does not: OverflowError)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT


def _bad_text(rec) -> str | None:
    """Where ("field turns[0].reply") the first string or key in `rec` that is not Unicode text is, else None:
    a lone surrogate (a JSON escape \\ud800 with no pair) cannot be printed, written as UTF-8 or tokenised."""
    try:
        json.dumps(rec, ensure_ascii=False, default=str).encode("utf-8")
        return None  # the common case, in C
    except UnicodeEncodeError:
        pass
    stack = [("", rec)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return f"field {path}" if path else "the record"
        elif isinstance(x, dict):
            kids = []
            for k, v in x.items():
                name = k if isinstance(k, str) and k.isidentifier() and len(k) <= 40 else None
                if name is None and isinstance(k, str):
                    try:
                        k.encode("utf-8")
                    except UnicodeEncodeError:
                        return f"a key of {'field ' + path if path else 'the record'}"
                label = f"{path}[{str(k)[:40]!r}]" if name is None else f"{path}.{name}" if path else name
                kids.append((label, v))
            stack += reversed(kids)
        elif isinstance(x, list):
            stack += reversed([(f"{path}[{i}]", v) for i, v in enumerate(x)])
    return "the record"


def check_record(rec, where: str = "record"):
    """Raise TrajectoryError naming `where` and the field when `rec` is not an episode record of the
    format above: every field a reader uses has its type (optional ones may be missing or null)."""
    if not isinstance(rec, dict):
        raise TrajectoryError(f"{where}: not a trajectory record (a JSON {type(rec).__name__}, not an object)")
    if not isinstance(rec.get("turns"), list):
        raise TrajectoryError(f"{where}: field 'turns' is missing or not a list")
    for key, ok, what in (("split", lambda v: isinstance(v, str), "a string"),
                          ("step", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
                          ("task_id", lambda v: isinstance(v, (str, int)) and not isinstance(v, bool), "a string or integer"),
                          ("episode_id", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
                          ("task", lambda v: isinstance(v, dict), "an object"),
                          ("metrics", lambda v: isinstance(v, dict), "an object"),
                          ("truncated", lambda v: isinstance(v, bool), "true or false"),
                          ("error", lambda v: isinstance(v, str), "a string")):
        if rec.get(key) is not None and not ok(rec[key]):
            raise TrajectoryError(f"{where}: field {key!r} must be {what} or null, got {str(rec[key])[:60]!r}")
    for key in ("step", "episode_id"):
        if rec.get(key) is not None and not _count(rec[key]):
            raise TrajectoryError(f"{where}: field {key!r} must be an integer in [0, 2**53] or null, got {str(rec[key])[:60]!r}")
    metrics = rec.get("metrics") or {}
    for key, v in metrics.items():  # the readers' own (team reward, tool calls) must be finite; any number a float
        if (key in ("tool_calls", "tool_errors") and not _number(v)) or \
                (v is not None and key == "team_reward" and not _number(v)) or \
                (isinstance(v, int) and not isinstance(v, bool) and not _number(v)):
            raise TrajectoryError(f"{where}: field {'metrics.' + str(key)[:40]!r} must be a finite number, got {str(v)[:60]!r}")
    task = rec.get("task") or {}
    if task.get("clips") is not None:  # the video tasks' clips: the calculator reads their ids
        if not isinstance(task["clips"], list) or not all(isinstance(c, dict) for c in task["clips"]):
            raise TrajectoryError(f"{where}: field 'task.clips' must be a list of objects")
        for i, c in enumerate(task["clips"]):
            if c.get("id") is not None and not isinstance(c["id"], str):
                raise TrajectoryError(f"{where}: field 'task.clips[{i}].id' must be a string, got {str(c['id'])[:60]!r}")
    if task.get("choices") is not None and not (isinstance(task["choices"], list)
                                                and all(isinstance(c, str) for c in task["choices"])):
        raise TrajectoryError(f"{where}: field 'task.choices' must be a list of strings")
    for k, t in enumerate(rec["turns"]):
        if not isinstance(t, dict):
            raise TrajectoryError(f"{where}: turns[{k}] is not an object")
        for key in ("role", "reply"):
            if not isinstance(t.get(key), str):
                raise TrajectoryError(f"{where}: turns[{k}].{key} is missing or not a string")
        for key in ("prompt", "finish_reason"):
            if t.get(key) is not None and not isinstance(t[key], str):
                raise TrajectoryError(f"{where}: turns[{k}].{key} is not a string")
        for key in ("reward", "env_reward", "advantage", "baseline"):
            if t.get(key) is not None and not _number(t[key]):
                raise TrajectoryError(f"{where}: turns[{k}].{key} must be a finite number or null, got {t[key]!r:.60}")
        ids = t.get("prompt_ids")
        if ids is not None and not (isinstance(ids, list) and all(type(i) is int and 0 <= i < 2**31 for i in ids)):
            raise TrajectoryError(f"{where}: turns[{k}].prompt_ids must be a list of token ids (integers in [0, 2**31))")
        for key in ("reply_tokens", "prompt_tokens", "turn"):
            n = t.get(key)
            if n is not None and not _count(n):
                raise TrajectoryError(f"{where}: turns[{k}].{key} must be an integer in [0, 2**53], got {str(n)[:60]!r}")
    try:
        bad = _bad_text(rec)
    except RecursionError:
        raise TrajectoryError(f"{where}: not a trajectory record (JSON nested too deeply)") from None
    if bad is not None:
        raise TrajectoryError(f"{where}: {bad} is not Unicode text (a lone surrogate escape such as \\ud800)")


def read(path, with_source: bool = False) -> list:
    """Every record of a trajectory file (or of every *.jsonl under a directory, in name order),
    checked (check_record): a line that is not UTF-8, not JSON (100k-deep nesting included) or not a
    record is a TrajectoryError naming file:line. with_source=True gives (f"{file}:{line}", record)."""
    path = Path(path)
    if not path.exists():
        raise TrajectoryError(f"{path}: no such file or directory")
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    out = []
    for p in files:
        data = read_bytes(p)
        for i, raw in enumerate(data.split(b"\n"), 1):
            where = f"{p}:{i}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TrajectoryError(f"{where}: not UTF-8 text (byte {e.start + 1} of the line)") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:  # JSONDecodeError, or an integer past Python's 4300 digits
                raise TrajectoryError(f"{where}: not a trajectory record (bad JSON: {e})") from None
            except RecursionError:
                raise TrajectoryError(f"{where}: not a trajectory record (JSON nested too deeply)") from None
            check_record(rec, where)
            out.append((where, rec) if with_source else rec)
    return out


def show(record: dict, width: int = 160) -> str:
    """A short, per-role rendering of one episode for the console."""
    lines = [f"task {record.get('task_id')} ({record.get('split')} step {record.get('step')}): "
             + str((record.get("task") or {}).get("question", ""))[:width]]
    for t in record["turns"]:
        reply = " ".join(t["reply"].split())
        reward = "-" if t.get("reward") is None else f"{t['reward']:.2f}"
        lines.append(f"  [{t['role']}] reward {reward}: {reply[:width]}")
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
    """An inline SVG line chart of `<prefix>/reward/<role>` (and the team, black) over steps. Each series
    has its own dash pattern and is drawn 1.5 px below the one before, so equal curves (a team reward
    that is the generator's) stay visible; the axis spans 0-1 and any reward outside it (a +-1 judge)."""
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    dashes = ["", "7,3", "2,2", "9,3,2,3", "4,4", "1,3"]
    series = [(r, f"{prefix}/reward/{r}", colors[i % len(colors)], dashes[i % len(dashes)]) for i, r in enumerate(roles)]
    series.append(("team", f"{prefix}/team_reward", "#000", "5,4"))
    samples = [x["step"] for x in rows if any(k in x for _, k, _, _ in series)]
    lo, hi = (min(samples), max(samples)) if samples else (0, 1)
    vals = [float(x[k]) for x in rows for _, k, _, _ in series if isinstance(x.get(k), (int, float)) and math.isfinite(x[k])]
    vlo, vhi = min([0.0] + vals), max([1.0] + vals)
    L, R, T, B = 40, 150, 24, 30
    sx = (lambda s: L + (w - L - R) * ((s - lo) / (hi - lo) if hi > lo else 0.5))
    sy = (lambda v: T + (h - T - B) * (1 - (max(vlo, min(vhi, v)) - vlo) / (vhi - vlo)))
    el = [f'<svg class="curves" data-split="{prefix}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">',
          f'<text x="{L}" y="15" font-size="13" font-weight="bold">{prefix} reward per role</text>',
          f'<rect x="{L}" y="{T}" width="{w - L - R}" height="{h - T - B}" fill="none" stroke="#999"/>']
    for v in sorted({vlo, 0, 0.5, 1, vhi}):
        el.append(f'<text x="{L - 6}" y="{sy(v) + 4:.1f}" font-size="10" text-anchor="end">{v:g}</text>')
    for s in sorted({lo, hi}):
        el.append(f'<text x="{sx(s):.1f}" y="{h - B + 14}" font-size="10" text-anchor="middle">{s}</text>')
    el.append(f'<text x="{(L + w - R) / 2:.0f}" y="{h - 4}" font-size="10" text-anchor="middle">step</text>')
    k = 0
    for name, key, color, dash in series:
        pts = [(x["step"], x[key]) for x in rows if key in x]
        if not pts:
            continue
        off = 1.5 * k  # equal curves drawn apart
        path = " ".join(f"{sx(s):.1f},{sy(v) + off:.1f}" for s, v in pts)
        el.append(f'<polyline class="series" data-role="{html.escape(name)}" points="{path}" fill="none" '
                  f'stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        el += [f'<circle cx="{sx(s):.1f}" cy="{sy(v) + off:.1f}" r="3" fill="{color}"/>' for s, v in pts]
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
// Every field of a record reaches the page as text (text nodes, attribute values through setAttribute,
// numbers through num()): nothing a model wrote, nor anything a crafted file holds, is parsed as HTML.
const EPS = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const str = (x) => (x === null || x === undefined) ? "" : String(x);
const num = (x) => (typeof x === "number" && isFinite(x)) ? x : null;
const turns = (e) => Array.isArray(e.turns) ? e.turns.filter((t) => t && typeof t === "object") : [];
function el(tag, attrs, ...kids) {{
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, str(v));
  n.append(...kids);  // strings become text nodes
  return n;
}}
function fill(id, values) {{
  for (const v of values) {{ const o = document.createElement("option"); o.value = o.textContent = str(v); $(id).appendChild(o); }}
}}
fill("split", [...new Set(EPS.map((e) => str(e.split)))].sort());
fill("step", [...new Set(EPS.map((e) => str(e.step)))].sort((a, b) => Number(a) - Number(b)));
fill("role", [...new Set(EPS.flatMap((e) => turns(e).map((t) => str(t.role))))].sort());
function score(e, role) {{
  const team = e.metrics && typeof e.metrics === "object" ? num(e.metrics.team_reward) : null;
  if (!role && team !== null) return team;
  const ts = turns(e).filter((t) => !role || str(t.role) === role);
  return ts.length ? ts.reduce((a, t) => a + (num(t.reward) || 0), 0) / ts.length : 0;
}}
function render() {{
  const split = $("split").value, step = $("step").value, role = $("role").value, min = $("min").value;
  const shown = EPS.filter((e) => (!split || str(e.split) === split) && (!step || str(e.step) === step)
    && (!role || turns(e).some((t) => str(t.role) === role)) && (min === "" || score(e, role) >= Number(min)));
  $("count").textContent = shown.length + " of " + EPS.length + " episodes";
  $("episodes").replaceChildren(...shown.map((e) => {{
    const r = score(e, role), task = e.task && typeof e.task === "object" ? e.task : {{}};
    const d = el("details", {{"class": "episode", "data-role-reward": r}},
      el("summary", {{}}, str(e.split) + " step " + str(e.step) + " · task " + str(e.task_id) + " · ",
         el("span", {{"class": r > 0.5 ? "good" : "bad"}}, "reward " + r.toFixed(2)),
         " · " + str(task.question || task.prompt).slice(0, 120)));
    for (const t of turns(e).filter((t) => !role || str(t.role) === role)) {{
      const rw = num(t.reward), adv = num(t.advantage);
      d.append(el("div", {{"class": "turn"}}, el("span", {{"class": "role"}}, str(t.role)),
        " reward " + (rw === null ? "-" : rw.toFixed(2)) + (adv === null ? "" : " · advantage " + adv.toFixed(2))
          + " · " + str(t.reply_tokens) + " tokens · " + str(t.finish_reason),
        el("pre", {{"class": "prompt"}}, str(t.prompt).slice(-600)), el("pre", {{}}, str(t.reply))));
    }}
    return d;
  }}));
}}
const q = new URLSearchParams(location.hash.slice(1));  // e.g. page.html#role=evaluator&min=0.5
for (const k of ["split", "step", "role", "min"]) if (q.has(k)) $(k).value = q.get(k);
for (const k of ["split", "step", "role", "min"]) $(k).addEventListener("input", render);
render();
if (q.has("open"))  // #open=2 expands the first two episodes shown
  [...document.querySelectorAll("details.episode")].slice(0, Number(q.get("open"))).forEach((d) => d.open = true);
</script></body></html>
"""


def _metric_rows(path: Path) -> list[dict]:
    """metrics.jsonl's rows as {"step": int, key: finite number}: a torn last line (a killed run) and
    anything that is not a number are left out. A metrics.jsonl that is not a regular file (a FIFO, a
    link to /dev/zero) is a TrajectoryError, as for trajectory files."""
    rows = []
    if not os.path.lexists(path):
        return rows
    for line in read_bytes(path).decode("utf-8", errors="replace").splitlines():
        try:
            x = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(x, dict) and _count(x.get("step")):
            rows.append({k: v for k, v in x.items() if k == "step" or _number(v)})
    return rows


def _embed(records: list[dict]) -> str:
    """The records as JSON that is safe inside <script type="application/json">: no '<', '>' or '&' (so
    no "</script>" nor "<!--<script>", which would swallow the page), no U+2028/2029."""
    data = json.dumps(records, default=str)
    for c, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        data = data.replace(c, esc)
    return data


def page_html(records: list[dict], rows: list[dict], title: str) -> str:
    """The static page for these records and metrics rows (write_html's content)."""
    roles = sorted({k.split("/", 2)[2] for x in rows for k in x if k.startswith(("train/reward/", "val/reward/"))}
                   | {str(t.get("role")) for r in records for t in r.get("turns") or [] if isinstance(t, dict)})
    charts = _svg_curves(rows, "train", roles) + _svg_curves(rows, "val", roles)
    return PAGE.format(title=html.escape(title), charts=charts, data=_embed(records))


def shown_path(path) -> str:
    """A path as printable text: a file name that is not UTF-8 (its bytes come back as lone surrogates)
    shows U+FFFD instead of failing the print or the page's UTF-8 encoding."""
    return os.fsencode(path).decode("utf-8", "replace")


def write_html(run_dir, path=None, max_episodes: int = 300) -> Path:
    """A static page (no network, no server): per-role reward curves from metrics.jsonl and a
    browsable, filterable sample of the run's episodes (the newest `max_episodes`, newest first). A bad trajectory
    file is a TrajectoryError naming file:line and the field."""
    run_dir = Path(run_dir)
    path = Path(path) if path else run_dir / "view.html"
    rows = _metric_rows(run_dir / "metrics.jsonl")
    tdir = run_dir / "trajectories"
    records = read(tdir) if tdir.is_dir() else []
    records = sorted(records, key=lambda r: (r.get("step") or 0, r.get("split") or ""), reverse=True)[:max_episodes]  # newest first
    try:
        text = page_html(records, rows, shown_path(run_dir))
    except RecursionError:
        raise TrajectoryError(f"{tdir}: a record nests too deeply to show") from None
    path.write_text(text, encoding="utf-8")
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
        if not path.is_dir():
            raise SystemExit(f"error: {path} is not a run directory")
        try:
            print(shown_path(write_html(path, a.html or None)))
        except (TrajectoryError, OSError) as e:
            raise SystemExit(f"error: {e}") from None
        return
    if path.is_dir() and (path / "trajectories").is_dir():
        path = path / "trajectories"
    if not path.exists():
        raise SystemExit(f"error: {path} does not exist")
    try:
        records = read(path)
    except TrajectoryError as e:
        raise SystemExit(f"error: {e}") from None
    chosen = select(records, a.step, a.role, a.split, a.min_reward, a.max_reward)
    print(f"{len(chosen)} of {len(records)} episodes match")
    for r in chosen[:a.limit]:
        if a.full:
            print(f"=== task {r.get('task_id')} ({r.get('split')} step {r.get('step')}) metrics {r.get('metrics')}")
            for t in r["turns"]:
                if a.role is None or t["role"] == a.role:
                    print(f"--- [{t['role']}] reward {t.get('reward')} · {t.get('reply_tokens')} tokens · "
                          f"{t.get('finish_reason')}\n{t.get('prompt')}\n>>> {t['reply']}")  # optional fields may be missing
        else:
            print(show(r))


if __name__ == "__main__":
    main()

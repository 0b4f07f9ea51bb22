"""A weighted reward calculator over trajectory records: named components, per-workflow definitions.

    python -m rewards.calculator --stats 'runs/X/trajectories/*.jsonl' [--min-reward 0.7]
    python -m rewards.calculator --stats 'runs/X/trajectories/train_*.jsonl' --config configs/math_3agent.py \
        --weights completion=0.5,quality=0.5 --budget evaluator_critique=128 --json stats.json

Every model turn of an episode gets four components in [0, 1] and their weighted mean:

    component    default weight   what it measures
    completion   0.4              the role did its job (an answer that is right, a verdict that is right)
    efficiency   0.2              tokens against the role's budget, turns, tool calls and errors
    quality      0.3              format, a verdict that matches the truth, calibrated critiques
    reasoning    0.1              steps shown before the final answer (or verdict)

A component is defined per workflow only where it means something; one that does not apply to a
turn is left out, and the weighted reward is sum(w_c * x_c) / sum(w_c) over the components that
apply (so every weighted reward is in [0, 1]). With the default weights a turn whose completion is 0
scores at most 0.6: `min_reward` > 0.6 keeps only turns that did their job.

Definitions. `right(text)` = rewards.math.math_reward(text, task["answer"]) == 1; `budget` = the
role's max_tokens (`budgets`, else `default_budget`); a turn that stopped on length has token
efficiency 0. An episode that ended with an env error or truncated has efficiency 0 on every turn.
A "step" is a line or sentence (split at newlines and after . ! ? ;) holding a letter or digit.

  math_3agent (roles generator_initial, evaluator_critique, generator_refinement):
    generators   completion  right(reply)   (no task answer in the record: the recorded reward, clipped)
                 efficiency  mean(1 - reply_tokens/budget,  1 - refinements/max_refinements)
                             refinements = the episode's generator_refinement turns (fewer rounds = better)
                 quality     format: 1 for a \\boxed{} answer, 0.5 for "#### x" / "the answer is x", 0 for none
                 reasoning   min(1, steps before the final answer / min_steps); 0 without an answer
    evaluator    completion  verdict (agents.math_team.parse_verdict) == right(the latest generator reply
                             before it); an unparseable verdict is 0
                 efficiency  1 - reply_tokens/budget
                 quality     mean(format, verdict match, calibration): format 1 when the last line is
                             exactly "Verdict: Correct|Incorrect", 0.5 when a verdict is found elsewhere,
                             0 without one; calibration: when the critique states an answer of its own
                             (rewards.math.extract_answer), whether that answer is the true one, else
                             the verdict match (a critique's claims must agree with the truth)
                 reasoning   min(1, steps before the verdict line / min_steps); 0 without a verdict
  math_single (role solver): as generator_initial, without the turns term.
  video (roles captioner, grapher, organizer: envs/video_qa.py; `choices` = the task's choices):
    every role   completion  the recorded (env) reward clipped: citation F1 / triple F1 / the right choice
                 efficiency  1 - reply_tokens/budget
    captioner    quality     mean(cites a clip id (of the video's clips, when the record has them),
                             makes a temporal reference (a timestamp m:ss, before / after / then /
                             because ...), names a choice)
    grapher      quality     mean(share of its triples that carry a clip id or link two clips (0 with
                             no triple), writes a temporal or causal link between clips, names a choice)
    captioner, grapher  reasoning  min(1, report lines besides the choice line / min_steps)
    organizer    quality     mean(answer format: 1 for "Answer: <letter>", 0.5 for a choice read any
                             other way, 0 for none; its reason cites a clip or makes a temporal reference)
  any other workflow (generic fallback):
                 completion  the recorded (env) reward clipped to [0, 1]
                 efficiency  mean(1 - reply_tokens/budget, and when the episode's metrics count tool
                             calls: 1 - tool_errors/tool_calls)
                 quality     1 if the reply ended on its own (finish_reason "stop"), else 0
                 reasoning   as for math generators when the reply holds a final answer, else n/a

The workflow is read from the roles of each record (math_3agent / math_single / video / generic) unless
`workflow=` names one. Weights, budgets and max_refinements come from a train config with
`RewardCalculator.from_config(cfg)` (it reads `cfg.data.reward_weights` when that field exists).
Online use: `rescore_episodes(calc, episodes)` replaces each rollout Sample's reward by the weighted
one (what a `reward = "calculator"` config choice in train.py calls after the rollout).

Every parser used here never raises and runs in linear time on hostile replies.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import trajectories
from agents.math_team import parse_verdict
from agents.video_team import answer_format, parse_choice, parse_clip_ids, parse_triples, report_lines, temporal_reference
from rewards.math import extract_answer, math_reward

TrajectoryError, check_record = trajectories.TrajectoryError, trajectories.check_record  # their home: trajectories.py

COMPONENTS = ("completion", "efficiency", "quality", "reasoning")
DEFAULT_WEIGHTS = {"completion": 0.4, "efficiency": 0.2, "quality": 0.3, "reasoning": 0.1}
MATH_3AGENT = ("generator_initial", "evaluator_critique", "generator_refinement")
VIDEO_QA = ("captioner", "grapher", "organizer")
WORKFLOWS = ("math_3agent", "math_single", "video", "generic")
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


# --------------------------------------------------------------------------------------------
# reading trajectory files: trajectories.py checks every record (one checker for every reader)


def load_records(patterns, with_source: bool = False) -> list:
    """Every episode record of the files matching the globs (or directories: their *.jsonl), checked
    by trajectories.read: a line that is not UTF-8 or JSON, or a record with a field of the wrong
    type, is a TrajectoryError naming file:line. with_source=True returns (f"{file}:{line}", record)."""
    patterns = [patterns] if isinstance(patterns, (str, Path)) else list(patterns)
    files = []
    for p in patterns:
        p = str(p)
        found = sorted(Path(x) for x in glob.glob(p, recursive=True)) if glob.has_magic(p) else [Path(p)]
        found = [f for x in found for f in (sorted(x.rglob("*.jsonl")) if x.is_dir() else [x])]
        if not found or not all(f.is_file() for f in found):
            raise FileNotFoundError(f"no trajectory file matches {p}")
        files += found
    return [r for f in files for r in trajectories.read(f, with_source=with_source)]


def detect_workflow(rec: dict) -> str:
    roles = {t["role"] for t in rec["turns"]}
    if roles == {"solver"}:
        return "math_single"
    if roles and roles <= set(MATH_3AGENT) and "generator_initial" in roles:
        return "math_3agent"
    if roles and roles <= set(VIDEO_QA) and "captioner" in roles:
        return "video"
    return "generic"


# --------------------------------------------------------------------------------------------
# the pieces the components are made of (never raise, linear time)

_SEGMENT = re.compile(r"\n+|(?<=[.!?;])\s++")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_MARKUP = re.compile(r"[*_`#>\[\]()]")
_VERDICT_ONLY = re.compile(r"verdict ?[:\-=]? ?(correct|incorrect) ?\.?")


def count_steps(text: str) -> int:
    """Lines or sentences holding a letter or digit."""
    return sum(1 for s in _SEGMENT.split(text) if _ALNUM.search(s))


def answer_position(text: str) -> tuple[int, float]:
    """(where the final answer starts, format score): a \\boxed{} answer 1.0, "#### x" or "the answer
    is x" 0.5, none (-1, 0.0)."""
    if extract_answer(text) is None:
        return -1, 0.0
    box = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if box >= 0 and extract_answer(text[box:]) is not None:
        return box, 1.0
    hashes = text.rfind("####")
    if hashes >= 0:
        return hashes, 0.5
    return max(0, text.lower().rfind("answer is")), 0.5


def verdict_position(text: str) -> tuple[int, float]:
    """(where the verdict line starts, format score): the last line exactly "Verdict: Correct|Incorrect"
    1.0, a verdict found elsewhere 0.5 (position: the last line naming a verdict, else the last line),
    none (-1, 0.0)."""
    if parse_verdict(text) is None:
        return -1, 0.0
    body = text.rstrip()
    start = body.rfind("\n") + 1
    last = " ".join(_MARKUP.sub(" ", body[start:].lower()).split())
    if _VERDICT_ONLY.fullmatch(last):
        return start, 1.0
    v = body.lower().rfind("verdict")
    return (body.rfind("\n", 0, v) + 1 if v >= 0 else start), 0.5


def steps_score(text: str, pos: int, min_steps: int) -> float:
    return 0.0 if pos < 0 else min(1.0, count_steps(text[:pos]) / max(1, min_steps))


# --------------------------------------------------------------------------------------------
# the calculator


@dataclass
class TurnScore:
    role: str
    components: dict  # component -> value in [0, 1], only those that apply to this turn
    weighted: float  # sum(w_c x_c) / sum(w_c) over the components present
    recorded: float | None  # the reward the env gave (the file's env_reward, else its reward)


class RewardCalculator:
    """Scores every turn of an episode record (the trajectory format, trajectories.py)."""

    def __init__(self, weights: dict | None = None, budgets: dict | None = None, default_budget: int = 256,
                 max_refinements: int = 3, min_steps: int = 2, workflow: str | None = None):
        w = dict(DEFAULT_WEIGHTS)
        for k, v in (weights or {}).items():
            if k not in COMPONENTS:
                raise ValueError(f"unknown reward component {k!r}: choose from {COMPONENTS}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"reward weight {k} must be a finite number >= 0, got {v!r}")
            w[k] = float(v)
        if sum(w.values()) <= 0:
            raise ValueError(f"reward weights must not all be 0: {w}")
        if workflow is not None and workflow not in WORKFLOWS:
            raise ValueError(f"unknown workflow {workflow!r}: choose from {WORKFLOWS} (generic = any other)")
        if default_budget < 1 or any(int(b) < 1 for b in (budgets or {}).values()):
            raise ValueError("token budgets must be >= 1")
        self.weights, self.budgets, self.default_budget = w, dict(budgets or {}), default_budget
        self.max_refinements, self.min_steps, self.workflow = max_refinements, min_steps, workflow
        self._right_cache: dict = {}

    @classmethod
    def from_config(cls, cfg, weights: dict | None = None, **kw) -> RewardCalculator:
        """Budgets (each role's max_tokens), max_refinements and the workflow from a train config;
        weights from `weights`, else `cfg.data.reward_weights` when the config has that field."""
        env = cfg.data.env
        wf = env if env in ("math_3agent", "math_single") else "video" if env == "video_qa" or \
            sorted(r.name for r in cfg.roles) == sorted(VIDEO_QA) else "generic"
        weights = weights if weights is not None else (getattr(cfg.data, "reward_weights", None) or None)
        return cls(weights, {r.name: r.max_tokens for r in cfg.roles}, workflow=wf,
                   max_refinements=cfg.data.max_refinement_iterations, **kw)

    def weighted(self, components: dict) -> float:
        ws = {c: self.weights[c] for c in components if self.weights[c] > 0}
        if not ws:
            return 0.0
        return sum(ws[c] * components[c] for c in ws) / sum(ws.values())

    def _right(self, text: str, answer: str) -> float:
        key = (text, answer)
        if key not in self._right_cache:
            if len(self._right_cache) > 100_000:
                self._right_cache.clear()
            self._right_cache[key] = float(math_reward(text, answer) == 1.0)
        return self._right_cache[key]

    def _tokens(self, turn: dict) -> float | None:
        if turn.get("finish_reason") == "length":
            return 0.0
        n = turn.get("reply_tokens")
        if n is None:
            return None
        return max(0.0, 1.0 - n / self.budgets.get(turn["role"], self.default_budget))

    def score_episode(self, rec: dict) -> list[TurnScore]:
        """One TurnScore per turn of the record, in order."""
        wf = self.workflow or detect_workflow(rec)
        task = rec.get("task") or {}
        answer = task.get("answer")
        answer = None if answer is None else str(answer)
        metrics = rec.get("metrics") or {}
        failed = bool(rec.get("error")) or bool(rec.get("truncated"))
        tools = None
        calls = metrics.get("tool_calls")
        if isinstance(calls, (int, float)) and calls > 0:
            tools = max(0.0, 1.0 - float(metrics.get("tool_errors", 0.0)) / calls)
        refinements = sum(t["role"] == "generator_refinement" for t in rec["turns"])
        out, last_solution = [], None  # the latest generator reply (what an evaluator judges)
        for t in rec["turns"]:
            # the env's own reward: `env_reward` when the file was written with reward=calculator
            role, reply = t["role"], t["reply"]
            recorded = t["env_reward"] if t.get("env_reward") is not None else t.get("reward")
            clipped = None if recorded is None else min(1.0, max(0.0, float(recorded)))
            c: dict[str, float] = {}
            eff = [x for x in [self._tokens(t)] if x is not None]
            if wf in ("math_3agent", "math_single") and role in ("generator_initial", "generator_refinement", "solver"):
                right = self._right(reply, answer) if answer is not None else clipped
                if right is not None:
                    c["completion"] = right
                if wf == "math_3agent" and self.max_refinements > 0:
                    eff.append(1.0 - min(refinements, self.max_refinements) / self.max_refinements)
                pos, fmt = answer_position(reply)
                c["quality"] = fmt
                c["reasoning"] = steps_score(reply, pos, self.min_steps)
                last_solution = reply
            elif wf == "math_3agent" and role == "evaluator_critique":
                verdict = parse_verdict(reply)
                if answer is not None and last_solution is not None:
                    match = float(verdict is not None and verdict == bool(self._right(last_solution, answer)))
                else:
                    match = clipped
                pos, fmt = verdict_position(reply)
                if match is not None:
                    c["completion"] = match
                    claimed = extract_answer(reply)
                    calib = self._right(reply, answer) if claimed is not None and answer is not None else match
                    c["quality"] = (fmt + match + calib) / 3
                else:
                    c["quality"] = fmt
                c["reasoning"] = steps_score(reply, pos, self.min_steps)
            elif wf == "video" and role in VIDEO_QA:
                if clipped is not None:
                    c["completion"] = clipped
                c.update(video_components(role, reply, task, self.min_steps))
            else:  # generic: what any workflow's record tells
                if clipped is not None:
                    c["completion"] = clipped
                if tools is not None:
                    eff.append(tools)
                c["quality"] = float(t.get("finish_reason", "stop") == "stop")
                pos, _ = answer_position(reply)
                if pos >= 0:
                    c["reasoning"] = steps_score(reply, pos, self.min_steps)
            if eff:
                c["efficiency"] = 0.0 if failed else sum(eff) / len(eff)
            c = {k: c[k] for k in COMPONENTS if k in c}
            out.append(TurnScore(role, c, self.weighted(c), None if recorded is None else float(recorded)))
        return out


def video_components(role: str, reply: str, task: dict, min_steps: int) -> dict:
    """quality (and reasoning for the two agents) of one video-QA turn (the module docstring)."""
    choices = task.get("choices") if isinstance(task.get("choices"), list) else [""] * 5
    choice = parse_choice(reply, choices)
    named = float(choice is not None)
    if role == "organizer":
        evidence = float(bool(parse_clip_ids(reply)) or temporal_reference(reply))
        return {"quality": (answer_format(reply, choices, choice) + evidence) / 2}
    if role == "captioner":
        ids = parse_clip_ids(reply)
        known = {c.get("id") for c in task.get("clips") or [] if isinstance(c, dict)}
        cites = float(any(i in known for i in ids) if known else bool(ids))
        quality = (cites + float(temporal_reference(reply)) + named) / 3
    else:
        triples = parse_triples(reply)
        anchored = sum(1 for t in triples if t[3] or (parse_clip_ids(t[0]) and parse_clip_ids(t[2])))
        links = any(t[3] == "" and parse_clip_ids(t[0]) and parse_clip_ids(t[2]) for t in triples)
        quality = ((anchored / len(triples) if triples else 0.0) + float(links) + named) / 3
    return {"quality": quality, "reasoning": min(1.0, report_lines(reply) / max(1, min_steps))}


def rescore_episodes(calc: RewardCalculator, episodes) -> None:
    """Online use: replace the reward of every Sample of these rollout.Episodes by the calculator's
    weighted reward (the components go to step.reward_components, the env's reward to
    step.env_reward; rescoring again starts from that, not from the weighted reward). Call
    it right after rollout.run_episodes."""
    for ep in episodes:
        rec = {"task": ep.task, "metrics": ep.metrics, "error": ep.error, "truncated": ep.truncated,
               "turns": [{"role": s.role, "reply": s.text, "reply_tokens": len(s.completion_ids),
                          "finish_reason": s.finish_reason, "reward": s.reward if s.env_reward is None else s.env_reward}
                         for s in ep.samples]}
        for s, sc in zip(ep.samples, calc.score_episode(rec)):
            s.env_reward, s.reward_components = sc.recorded, sc.components
            s.reward = sc.weighted


# --------------------------------------------------------------------------------------------
# statistics over files


def _describe(xs: list[float]) -> dict:
    a = np.asarray(xs, dtype=float)
    d = {"n": int(a.size), "mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()),
         "max": float(a.max())}
    d.update({f"p{round(q * 100)}": float(np.quantile(a, q)) for q in QUANTILES})
    return d


def stats(records: list[dict], calc: RewardCalculator, min_reward: float = 0.5) -> dict:
    """{role: {component | "weighted" | "recorded": {n, mean, std, min, max, p10..p90},
    "turns": n, "frac_weighted_ge_min": x, "frac_recorded_ge_min": x}} over every turn."""
    per: dict = {}
    for rec in records:
        for sc in calc.score_episode(rec):
            d = per.setdefault(sc.role, {k: [] for k in COMPONENTS + ("weighted", "recorded")})
            for k, v in sc.components.items():
                d[k].append(v)
            d["weighted"].append(sc.weighted)
            if sc.recorded is not None:
                d["recorded"].append(sc.recorded)
    out = {}
    for role in sorted(per):
        d = per[role]
        out[role] = {k: _describe(v) for k, v in d.items() if v}
        out[role]["turns"] = len(d["weighted"])
        out[role]["frac_weighted_ge_min"] = float(np.mean([x >= min_reward for x in d["weighted"]]))
        if d["recorded"]:
            out[role]["frac_recorded_ge_min"] = float(np.mean([x >= min_reward for x in d["recorded"]]))
    return out


def format_stats(st: dict, min_reward: float) -> str:
    cols = ["n", "mean", "std", "min"] + [f"p{round(q * 100)}" for q in QUANTILES] + ["max"]
    lines = [f"{'role':<22} {'component':<11} " + " ".join(f"{c:>6}" for c in cols)]
    for role, d in st.items():
        first = True
        for k in COMPONENTS + ("weighted", "recorded"):
            if k not in d:
                continue
            vals = [f"{d[k]['n']:>6d}"] + [f"{d[k][c]:>6.3f}" for c in cols[1:]]
            lines.append(f"{role if first else '':<22} {k:<11} " + " ".join(vals))
            first = False
        frac = f"weighted {d['frac_weighted_ge_min']:.1%}"
        if "frac_recorded_ge_min" in d:
            frac += f", recorded {d['frac_recorded_ge_min']:.1%}"
        lines.append(f"{'':<22} share of {d['turns']} turns with reward >= {min_reward:g}: {frac}")
    return "\n".join(lines)


def parse_pairs(items, what: str, cast=float) -> dict:
    """'a=1,b=2' (and/or repeated) -> {a: 1, b: 2}; a clear error naming `what`."""
    out = {}
    for item in items or []:
        for part in filter(None, item.split(",")):
            k, sep, v = part.partition("=")
            try:
                if not sep:
                    raise ValueError
                out[k.strip()] = cast(v)
            except ValueError:
                raise SystemExit(f"error: {what}: expected NAME=VALUE, got {part!r}") from None
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="The components, per workflow: see `python -c 'import rewards.calculator as c; "
                                       "print(c.__doc__)'`")
    p.add_argument("--stats", nargs="+", required=True, metavar="GLOB",
                   help="trajectory files (globs, quoted; or directories): runs/X/trajectories/*.jsonl")
    p.add_argument("--min-reward", type=float, default=0.5, help="report the share of turns >= this (default 0.5)")
    p.add_argument("--weights", action="append", metavar="C=W,...",
                   help="component weights, e.g. completion=0.5,efficiency=0 (unnamed ones keep their default)")
    p.add_argument("--budget", action="append", metavar="ROLE=N,...", help="a role's token budget (its max_tokens)")
    p.add_argument("--default-budget", type=int, default=256, help="token budget of roles not named (default 256)")
    p.add_argument("--max-refinements", type=int, default=3, help="math_3agent: the refinement limit (default 3)")
    p.add_argument("--min-steps", type=int, default=2, help="reasoning: steps before the answer that score 1")
    p.add_argument("--workflow", choices=WORKFLOWS, help="the component definitions (default: read from the roles)")
    p.add_argument("--config", help="a train config (configs/*.py): budgets, max_refinements, workflow from it")
    p.add_argument("--json", metavar="OUT", help="also write the statistics as JSON to this file (in a folder that "
                   "exists; never one of the trajectory files read)")
    a = p.parse_args(argv)
    weights, budgets = parse_pairs(a.weights, "--weights"), parse_pairs(a.budget, "--budget", int)
    out = Path(a.json) if a.json else None
    if out is not None and (out.is_dir() or not out.parent.is_dir()):  # say so now, not after the statistics
        raise SystemExit(f"error: --json {a.json}: " + ("is a directory; name a file in it, e.g. "
                         f"{out / 'stats.json'}" if out.is_dir() else f"its folder {out.parent} does not exist"))
    try:
        if a.config:
            from config import load_config_file
            calc = RewardCalculator.from_config(load_config_file(a.config), weights or None, min_steps=a.min_steps)
            calc.budgets.update(budgets)
            calc.workflow = a.workflow or calc.workflow
        else:
            calc = RewardCalculator(weights, budgets, a.default_budget, a.max_refinements, a.min_steps, a.workflow)
        sourced = load_records(a.stats, with_source=True)
    except (ValueError, FileNotFoundError, TypeError) as e:  # TypeError: a config file without `config`
        raise SystemExit(f"error: {e}") from None
    records = [r for _, r in sourced]
    if out is not None and out.resolve() in {Path(w.rsplit(":", 1)[0]).resolve() for w, _ in sourced}:
        raise SystemExit(f"error: --json {a.json}: is one of the trajectory files read; it would be overwritten")
    st = stats(records, calc, a.min_reward)
    n_turns = sum(len(r["turns"]) for r in records)
    print(f"{len(records)} episodes, {n_turns} turns | weights " + " ".join(f"{k}={v:g}" for k, v in calc.weights.items()))
    print(format_stats(st, a.min_reward))
    if out is not None:
        try:
            out.write_text(json.dumps(st, indent=1))
        except OSError as e:  # no permission, a full disk, ...
            raise SystemExit(f"error: --json {a.json}: cannot write it ({e.strerror or e})") from None
    return st


if __name__ == "__main__":
    main(sys.argv[1:])

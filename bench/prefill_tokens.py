"""Tokens a workflow's episode costs with and without prefix reuse, counted exactly on its scripted
team's episodes (no model runs: seconds, any machine).

    python bench/prefill_tokens.py                                  # every workflow with a teacher
    python bench/prefill_tokens.py --configs math_tool,swe_team --tasks 50

Each config's train tasks (the first --tasks) are played by the workflow's scripted perfect team
(`scripted_replies`, as sft.py's teacher) through its env; every prompt goes through SmolLM2's chat
template, every reply is its tokens + EOS, as the engine would return it. Counted per episode, with
the roles on the config's adapters and, for the `shared` rows, every role on ONE adapter:

    prompt tokens   sum of every turn's prompt: what an engine without a prefix cache prefills, and the
                    tokens an update without packing reads besides the replies
    prefilled       what TorchEngine's prefix cache (unbounded here) leaves to prefill: each prompt minus
                    the longest earlier prompt + reply of the same adapter in the episode that it extends
    update tokens   tokens the update's forwards read: per row (learner.Packed: turns that extend one
                    another share a row) its longest prompt + reply; unpacked, every turn's prompt + reply

`before` is each env's old layout where it has one (math_tool and search: layout="message"), `per_role`
each role's own growing chat (math_tool, search, research: layout="per_role"); swe_team's
rounds have no switch (the old prompts are gone), so its before is the "no cache, no packing" count.
These are a perfect team's episodes: math_tool's ends in one cycle and a trained team's may take more;
step time also pays for decoding, the sandbox and the optimizer, so a token ratio bounds the prefill and
update share of the gain, not the step's (bench/step_time.py measures that).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from config import load_config_file  # noqa: E402
from workflows import load_data, workflow  # noqa: E402

CONFIGS = ("math_tool", "search", "research", "react_calculator", "swe_team", "code", "video_qa")
OLD_LAYOUT = {"math_tool": {"layout": "message"}, "search": {"layout": "message"}}
PER_ROLE = {"math_tool": {"layout": "per_role"}, "search": {"layout": "per_role"}, "research": {"layout": "per_role"}}


def extends(full: list[int], prompt: list[int]) -> bool:
    return len(prompt) >= len(full) and prompt[:len(full)] == full


def count(episodes: list[list[tuple[str, list[int], list[int]]]], adapter_of) -> dict:
    """episodes: per episode its turns (role, prompt ids, completion ids) -> the three token counts."""
    prompt = prefilled = update_unpacked = update_packed = 0
    for turns in episodes:
        seen: dict[str, list[list[int]]] = {}  # adapter -> earlier prompt + reply sequences
        rows: dict[str, list[list[int]]] = {}  # adapter -> each row's longest sequence so far
        for role, p, c in turns:
            a, full = adapter_of(role), p + c
            prompt += len(p)
            update_unpacked += len(full)
            hit = max((len(f) for f in seen.get(a, []) if extends(f, p)), default=0)
            prefilled += len(p) - hit
            seen.setdefault(a, []).append(full)
            mine = rows.setdefault(a, [])
            ext = [i for i, r in enumerate(mine) if extends(r, p)]
            if ext:
                mine[max(ext, key=lambda i: len(mine[i]))] = full
            else:
                mine.append(full)
        update_packed += sum(len(r) for rs in rows.values() for r in rs)
    return {"prompt": prompt, "prefilled": prefilled, "update": update_unpacked, "update_packed": update_packed}


def play(cfg, tok, n: int, env_kwargs: dict | None = None):
    """The scripted team's episodes of the config's first n train tasks: per episode its turns (role, prompt
    ids as the driver builds them: a turn that continues an earlier one is spliced onto it, rollout.prompt_ids;
    the reply's ids + EOS), and the team rewards."""
    from envs import play_replies
    from rollout import prompt_ids
    if env_kwargs:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={**cfg.data.env_kwargs, **env_kwargs}))
    make_env, module, _ = workflow(cfg)
    episodes, rewards = [], []
    if not hasattr(module, "scripted_replies") and not hasattr(make_env(), "scripted_replies"):
        return episodes, rewards
    for task in load_data(cfg)[0][:n]:
        env = make_env()
        replies = (getattr(env, "scripted_replies", None) or module.scripted_replies)(task)
        if not replies:
            continue
        turns, said = [], []
        for turn, r in play_replies(env, task, replies):
            p, c = prompt_ids(tok, turn.messages, said)[0], tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]
            turns.append((turn.role, p, c))
            said.append((turn.messages, p, c, r))
        episodes.append(turns)
        rewards.append(env.metrics().get("team_reward", 0.0))
    return episodes, rewards


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS), help="configs/<name>.py, comma-separated")
    ap.add_argument("--tasks", type=int, default=40, help="train tasks per config (the first ones)")
    a = ap.parse_args()
    os.chdir(ROOT)
    from model import load_model
    tok = load_model("smollm2-135m-instruct")[1]
    print(f"{'config':18}{'layout':9}{'episodes':>9}{'turns':>7}{'prompt tok':>11}{'prefilled':>10}{'ratio':>7}"
          f"{'update tok':>11}{'packed':>8}{'ratio':>7}{'shared: prefilled':>18}{'packed':>8}")
    for name in a.configs.split(","):
        cfg = load_config_file(str(ROOT / "configs" / f"{name}.py"))  # its data paths: relative to the repo
        adapter = {r.name: cfg.adapter_of(r) for r in cfg.roles}
        layouts = [("before", OLD_LAYOUT[name]), ("after", {})] if name in OLD_LAYOUT else [("now", {})]
        layouts += [("per_role", PER_ROLE[name])] if name in PER_ROLE else []
        for layout, kw in layouts:
            episodes, rewards = play(cfg, tok, a.tasks, kw)
            if not episodes:
                print(f"{name:18}{layout:9} no scripted episode")
                continue
            c, s = count(episodes, adapter.get), count(episodes, lambda r: "one")
            print(f"{name:18}{layout:9}{len(episodes):9d}{sum(map(len, episodes)):7d}{c['prompt']:11d}{c['prefilled']:10d}"
                  f"{c['prompt'] / c['prefilled']:6.2f}x{c['update']:11d}{c['update_packed']:8d}"
                  f"{c['update'] / c['update_packed']:6.2f}x{s['prefilled']:18d}{s['update_packed']:8d}"
                  f"   (team reward {sum(rewards) / len(rewards):.2f})", flush=True)


if __name__ == "__main__":
    main()

"""The rules a troupe config must satisfy across its sections, and the helpers that name a bad field in one line.

config.py is the schema: each section's fields with their docstrings, and each section's `check` of its own
fields. What spans sections is here: roles that share an adapter must agree (`check_roles`), and options that
cannot run together are refused (`check_across`: a new option that conflicts with another gets its refusal
here). `Config.validate` runs no_nan, check_roles, every section's check, then check_across. A leaf: it imports
nothing of troupe; config.py imports it and re-exports ConfigError, the bounds and check_name.
"""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path


class ConfigError(ValueError):
    """A bad config value; the message names the field."""


# Bounds a value must stay within, named once: past them a run only produces
# NaN, a crash deep in torch, or a file outside the run directory.
MAX_LR = 1.0
"""no AdamW learning rate above this (LoRA RL and SFT use ~1e-6..1e-2; 1e30 only makes NaN adapters)"""
MIN_TEMPERATURE = 0.01
"""sampling temperatures below this overflow the scaled logits (1e-300: inf, then NaN probabilities);
evaluation is greedy already"""
MAX_THREADS = 1024
"""trainer.threads above this is a typo (torch.set_num_threads(99999) ends in SIGSEGV); session.py
also caps any request at the machine's cores"""
MAX_SEED = 2**31 - 1
"""seeds are at most this: numpy refuses a seed past 2**32 - 1, and seed + epoch, seed + 12345 (eval.py's
sampling) must stay below that (4294967296 trained an SFT for minutes, then every eval died)"""
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
RESERVED_NAMES = ("critic",)  # GAE's value model wears an adapter of this name (critic.Critic)


def check_name(name, where: str):
    """Adapter and role names become directory names (<out>/<adapter>/, checkpoints' adapters/<name>/):
    1-64 of A-Z a-z 0-9 _ -, so '../x' or '/tmp/x' cannot write outside the run; 'critic' is reserved.
    `where` starts the error line ("config field roles[0].name", "sft option roles")."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{where}: {str(name)[:80]!r} is not a usable name: 1-64 letters, digits, '_' or '-' "
                          "(it names a directory)")
    if name in RESERVED_NAMES:
        raise ConfigError(f"{where}: {name!r} is reserved (GAE's value model wears the 'critic' adapter): pick "
                          "another name")


def bad(name, msg):
    raise ConfigError(f"config field {name}: {msg}")


def floats(obj, name):
    """(field path, value) of every float in a config, nested lists and dicts included."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from floats(getattr(obj, f.name), f"{name}.{f.name}" if name else f.name)
    elif isinstance(obj, (list, tuple)):
        for k, x in enumerate(obj):
            yield from floats(x, f"{name}[{k}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from floats(x, f"{name}.{k}")
    elif isinstance(obj, float):
        yield name, obj


def at_least(section: str, pairs):
    for name, v, lo in pairs:
        if v < lo:
            bad(f"{section}.{name}", f"must be >= {lo}, got {v}")


def finite(section: str, pairs, positive: bool):
    for name, v in pairs:
        if not (math.isfinite(v) and (v > 0 if positive else v >= 0)):
            bad(f"{section}.{name}", f"must be a finite number {'>' if positive else '>='} 0, got {v}")


def no_nan(cfg):
    """No NaN anywhere in a config, nested lists and dicts included."""
    try:
        for name, v in floats(cfg, ""):
            if math.isnan(v):
                bad(name, "is NaN")
    except RecursionError:  # a 20k-deep list in env_kwargs or reward_weights
        bad("data.env_kwargs", "a value is nested too deep (lists or dicts inside each other)")


def check_roles(cfg):
    """Each role's own fields (RoleConfig.check), then what roles sharing an adapter must agree on."""
    if not cfg.roles:
        bad("roles", "at least one role is needed")
    if len({r.name for r in cfg.roles}) != len(cfg.roles):
        bad("roles", "role names must be unique")
    for i, r in enumerate(cfg.roles):
        check_name(cfg.adapter_of(r), f"config field roles[{i}].{'name' if r.adapter is None else 'adapter'}")
        r.check(i, cfg.lora_of(r)[2], cfg.model.spec)
        same = [o for o in cfg.roles if cfg.adapter_of(o) == cfg.adapter_of(r)]
        for f in ("trainable", "init_from", "frozen_steps", "train_windows", "balance_labels"):
            if any(getattr(o, f) != getattr(r, f) for o in same):
                bad(f"roles[{i}].{f}", f"roles sharing adapter {cfg.adapter_of(r)!r} disagree on {f}")
        for f, get in (("lr", cfg.lr_of), ("rank/alpha/targets", cfg.lora_of), ("adv_estimator", cfg.estimator_of)):
            if any(repr(get(o)) != repr(get(r)) for o in same):  # repr: nan equals nan here
                bad(f"roles[{i}].{f}", f"roles sharing adapter {cfg.adapter_of(r)!r} disagree on {f}")


def check_across(cfg):
    """The rules that span sections: options that cannot run together, each refused with one line."""
    if not cfg.trainable_adapters:
        bad("roles", "every role has trainable=False: nothing would train")
    if cfg.mode != "rl":
        if cfg.sft_config is None:
            bad("sft_config", f"mode={cfg.mode!r} needs an sft.py config file (`config = SFTConfig(...)`, e.g. "
                 "configs/sft/tiny_math.py): what SFT learns from")
        if not Path(cfg.sft_config).is_file():
            bad("sft_config", f"{cfg.sft_config} is not a file")
    if any(r.team_reward_weight and cfg.estimator_of(r) == "remax" for r in cfg.roles if r.trainable):
        bad("roles.team_reward_weight", "remax's greedy baseline is the twin turn's own reward, unmixed: use "
             "another estimator for a role that mixes in the team reward")
    if cfg.data.reward == "calculator" and "remax" in cfg.estimators:
        bad("data.reward", "remax's greedy baseline episode is scored by the env, not the calculator: "
             "use data.reward=env with remax")
    ro, al = cfg.rollout, cfg.algo
    if (ro.top_p < 1 or ro.top_k > 0) and (al.rollout_is_on(ro.engine) or al.recompute_old_logprobs == "never"):
        use = ("the rollout IS weight (algo.rollout_is, on by default with vLLM)" if al.rollout_is_on(ro.engine)
               else "the old-policy ratio (algo.recompute_old_logprobs never)")
        bad("rollout.top_p" if ro.top_p < 1 else "rollout.top_k", "truncated sampling: the engine's logprobs are "
             f"under the truncated, renormalised distribution and the trainer's under the full one, so {use} would "
             "weight every token by the kept mass (TRL #6789): set algo.rollout_is off and "
             "algo.recompute_old_logprobs auto, or rollout.top_p 1 and rollout.top_k 0")
    if ro.tree_sampling:
        for broken, why in (
                (not al.group_by_turn, "needs algo.group_by_turn true: a node's candidates share one prompt, and "
                 "only a (task, role, turn) group holds exactly them"),
                (ro.num_chains < 2, f"needs rollout.num_chains >= 2 (a node's candidates), got {ro.num_chains}"),
                (ro.merge_turns, "needs rollout.merge_turns false: after the first node a chain's turns continue "
                 "the best candidate's conversation, not its own, and each turn is paid at its node"),
                ("remax" in cfg.estimators, "cannot run with remax, whose greedy twins fork episodes too: use a "
                 "grouped estimator"),
                (any(r.team_reward_weight for r in cfg.roles if r.trainable), "cannot run with "
                 "roles.team_reward_weight: the team reward is the episode's, and every chain of a task ends on "
                 "the same chosen path, so it is one number for every candidate of a node (no signal)"),
                (cfg.data.reward == "calculator", "needs data.reward=env: the calculator rescores whole "
                 "trajectories, and a tree chain is not one")):
            if broken:
                bad("rollout.tree_sampling", why)
    if cfg.rollout.merge_turns and any(cfg.estimator_of(r) == "remax" for r in cfg.roles if r.trainable):
        bad("rollout.merge_turns", "remax's baseline is per turn (the greedy reply to that turn's prompt), but a "
             "merged sequence keeps only its last turn's reward and baseline: the earlier turns' tokens would be "
             "judged against the later turn's greedy baseline. Use remax without merge_turns, or another estimator")

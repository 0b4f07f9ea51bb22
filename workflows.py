"""Which workflow a config names, and its tasks: the built-ins in a plain dict, or your own
`module:Class` / `path/to/file.py:Class` (README "Add a workflow"). Checked before any model loads.
"""
from __future__ import annotations

from pathlib import Path

from config import Config, ConfigError


_FILE_MODULES = {}  # resolved path -> the module a `file.py:Class` env was executed into, once per process


def _file_module(where: str):
    """The module of a `path/to/file.py:Class` env, executed on its first lookup only: a run looks its workflow
    up many times (checks, data, every rollout, eval), and a file executed anew each time would run its
    top-level code again and hand out a new class each time. A new process reads the file anew."""
    import importlib.util
    path = Path(where).resolve()
    if path not in _FILE_MODULES:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or not path.is_file():
            raise ConfigError(f"config field data.env: {where} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _FILE_MODULES[path] = module
    return _FILE_MODULES[path]


def workflow(cfg: Config):
    """(make_env, env module, load_tasks) of the configured workflow: a built-in from a plain dict,
    or your own `module:Class` / `file.py:Class` (its module may define load_tasks(spec) and
    aggregate(episodes); tasks default to the math loader)."""
    from data.math_data import load_math
    d = cfg.data
    if ":" in d.env:
        import importlib
        where, cls = d.env.rsplit(":", 1)
        if where.endswith(".py"):
            module = _file_module(where)
        else:
            module = importlib.import_module(where)
        if not hasattr(module, cls):
            raise ConfigError(f"config field data.env: {where} has no class {cls!r}")
        return (lambda: getattr(module, cls)(**d.env_kwargs)), module, getattr(module, "load_tasks", load_math)
    from envs import code_team, debate, math_3agent, math_single, math_tool, react, research, search_team, swe, toy, video_qa
    from envs import split_info
    from envs import reason_code
    from data.code_data import load_code_tasks, load_humaneval
    builtins = {  # name -> (make_env(**env_kwargs), module, load_tasks); their names: BUILTINS
        "math_3agent": (lambda **kw: math_3agent.MathTeamEnv(d.max_refinement_iterations, **kw), math_3agent, load_math),
        "math_single": (math_single.MathSingleEnv, math_single, load_math),
        "math_tool": (lambda **kw: math_tool.MathToolEnv(d.max_refinement_iterations, **kw), math_tool, load_math),
        "code": (lambda **kw: code_team.CodeTeamEnv(d.max_refinement_iterations, **kw), code_team,
                 lambda spec: load_humaneval() if spec == "humaneval" else load_code_tasks(spec)),
        "search": (lambda **kw: search_team.SearchTeamEnv(**{"max_refinement_iterations": d.max_refinement_iterations,
                                                             **kw}), search_team, load_math),
        "react": (lambda **kw: react.ToolAgentEnv(**{"max_tool_calls": d.max_refinement_iterations, **kw}), react,
                  react.load_tasks),
        "research": (research.ResearchEnv, research, research.load_tasks),
        "swe": (lambda **kw: swe.SWETeamEnv(d.max_refinement_iterations, **kw), swe, swe.load_tasks),
        "toy": (toy.ToyEnv, toy, toy.load_tasks),
        "debate": (debate.DebateEnv, debate, load_math),
        "video_qa": (video_qa.VideoQAEnv, video_qa, video_qa.load_tasks),
        "split_info": (split_info.SplitInfoEnv, split_info, split_info.load_tasks),
        "split_info_single": (split_info.SplitInfoSingleEnv, split_info, split_info.load_tasks),
        "reason_code": (reason_code.ReasonCodeEnv, reason_code, reason_code.load_tasks),
    }
    make, module, load = builtins[d.env]
    return (lambda: make(**d.env_kwargs)), module, load


BUILTINS = ("math_3agent", "math_single", "math_tool", "code", "search", "react", "research", "swe", "toy", "video_qa",
            "debate", "split_info", "split_info_single", "reason_code")


def check_names(cfg: Config):
    """The workflow name and the reward calculator's component names, before any model loads; the error
    names the field and lists the known names. A workflow's own names (the react env's tools and reward)
    are checked by its class when check_roles builds one."""
    d = cfg.data
    if d.env not in BUILTINS and ":" not in d.env:
        raise ConfigError(f"config field data.env: unknown workflow {d.env!r}: one of {BUILTINS}, or module:Class / "
                          "file.py:Class")
    if d.reward_weights:
        from rewards.calculator import RewardCalculator
        try:
            RewardCalculator(dict(d.reward_weights))
        except ValueError as e:
            raise ConfigError(f"config field data.reward_weights: {e}") from None


def check_roles(cfg: Config):
    """The workflow's roles and the config's must match, before anything loads; a workflow module's
    check_config(cfg, grouped_estimators) -> (field, why) | None adds its own rules."""
    try:
        make_env, module, _ = workflow(cfg)
        env = make_env()
    except ConfigError:
        raise
    except (TypeError, ValueError, FileNotFoundError) as e:  # an unknown or bad keyword, a missing file
        raise ConfigError(f"config field data.env_kwargs: workflow {cfg.data.env!r} refused {dict(cfg.data.env_kwargs)}: "
                          f"{e}") from None
    env_roles = set(getattr(env, "roles", ()))
    mine = {r.name for r in cfg.roles}
    if env_roles and env_roles != mine:
        raise ConfigError(f"config field roles: workflow {cfg.data.env!r} has roles {sorted(env_roles)}, the config "
                         f"names {sorted(mine)} (missing {sorted(env_roles - mine)}, unknown {sorted(mine - env_roles)})")
    if cfg.rollout.tree_sampling and not getattr(env, "rewards_so_far", False):
        raise ConfigError(f"config field rollout.tree_sampling: workflow {cfg.data.env!r} does not pay a turn before "
                          "its episode ends (its env does not set rewards_so_far = True), and tree sampling pays each "
                          "candidate at its node")
    if hasattr(module, "check_config"):  # the workflow's own rules across its options and the trainer's
        import ppo
        if bad := module.check_config(cfg, ppo.GROUPED):
            raise ConfigError(f"config field {bad[0]}: {bad[1]}")


def load_data(cfg: Config):
    """Training and validation tasks: read (and checked) before any model loads."""
    load_tasks = workflow(cfg)[2]

    def tasks_of(files, field):
        ts = load_tasks(files)
        if cfg.data.levels is not None:
            ts = [x for x in ts if x.get("level") in cfg.data.levels]
        if not ts:
            raise ConfigError(f"config field {field}: no task in {files}" +
                             (f" with a level in data.levels={cfg.data.levels}" if cfg.data.levels else ""))
        return ts
    return tasks_of(cfg.data.train_files, "data.train_files"), tasks_of(cfg.data.val_files, "data.val_files")[:cfg.data.val_size]

"""troupe's configuration: nested dataclasses, a docstring under every field (tyro shows them in
`python train.py --help`). A config file under configs/ builds one `Config` named `config`;
`train.py --config configs/X.py --algo.adv-estimator rloo` applies CLI overrides on top.
Derived values are properties, not fields. `Config.validate()` names the bad field.

Kept apart from train.py so that config files can import it without importing the trainer.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


class ConfigError(ValueError):
    """A bad config value; the message names the field."""


@dataclass
class ModelConfig:
    spec: str = "tiny"
    """preset name (tiny, smollm2-135m-instruct), a .gguf file, a local HF directory, or a hub id"""
    dtype: str = "float32"
    """weights dtype of the base model: float32 or bfloat16 (LoRA adapters are always fp32)"""
    gradient_checkpointing: bool = False
    """recompute activations in backward (saves memory on long sequences)"""


@dataclass
class RoleConfig:
    name: str = "solver"
    """role name, as the env calls it"""
    adapter: str | None = None
    """LoRA adapter this role wears; None = its own adapter named after the role. Roles that name
    the same adapter share it (every role naming one adapter = the parameter-sharing baseline)"""
    max_tokens: int = 256
    """max new tokens per turn of this role"""
    temperature: float = 1.0
    """sampling temperature in training rollouts (eval is greedy)"""
    trainable: bool = True
    """False freezes this role's adapter: it acts in rollouts but is never updated (roles sharing
    an adapter must agree)"""
    init_from: str | None = None
    """start this role's adapter from a saved PEFT adapter directory (sft.py's output, a checkpoint's
    adapters/<name>) instead of a fresh one; its rank and alpha are kept, its target modules must
    be lora.targets. A checkpoint being resumed overrides it"""


@dataclass
class LoRAConfig:
    rank: int = 64
    """LoRA rank. RL updates are low-rank: rank 8-64 match full fine-tuning in RL studies
    (Schulman & Thinking Machines, 'LoRA Without Regret', 2025), so small ranks are fine"""
    alpha: float = 16.0
    """LoRA alpha; the update is scaled by alpha / rank"""
    dropout: float = 0.05
    """dropout on the CRITIC adapter's input (GAE's value model, a regression). Policy adapters
    never use dropout: old and new logprobs must come from the same network, or the PPO ratio is
    not 1 on policy (it reached 1.107 at dropout 0.05 when they did)"""
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """projection names to adapt. The 3-agent design uses attention only; RL evidence favours all
    linear layers (add gate_proj, up_proj, down_proj) with a ~10x higher LR than full fine-tuning"""


@dataclass
class AlgoConfig:
    adv_estimator: Literal["grpo", "rloo", "reinforce++", "reinforce++_baseline", "remax", "gae"] = "grpo"
    """advantage estimator (see ppo.py's docstring for when to use which)"""
    norm_by_std: bool = True
    """GRPO: divide by the group std (False = Dr. GRPO)"""
    gamma: float = 1.0
    """discount (reinforce++, gae)"""
    lam: float = 1.0
    """GAE lambda"""
    group_by_turn: bool = False
    """group samples by (task, role, turn) instead of (task, role)"""
    policy_loss: Literal["ppo", "gspo"] = "ppo"
    """token-level PPO clip, or GSPO's sequence-level ratio (which brings GSPO's own defaults for
    the clip range, 3e-4 / 4e-4, and loss_agg seq-mean-token-mean, unless you set them)"""
    clip_low: float | None = None
    """epsilon below 1 (None: 0.2 for ppo, 3e-4 for gspo)"""
    clip_high: float | None = None
    """epsilon above 1, 'clip-higher' (DAPO) (None: 0.28 for ppo, 4e-4 for gspo)"""
    dual_clip: float | None = 3.0
    """dual-clip constant c for negative advantages (None = off)"""
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None = None
    """how per-token losses are aggregated (None: token-mean for ppo, seq-mean-token-mean for gspo).
    seq-mean-token-sum-norm divides by a constant, the role's max_tokens (Dr. GRPO)"""
    kl_kind: str = "low_var_kl"
    """kl (k1), abs, mse (k2), low_var_kl (k3), optionally with '+' (straight-through k1 gradient),
    or full (exact KL over the vocabulary: one more no-grad forward per micro-batch)"""
    kl_coef: float = 0.0
    """KL coefficient (0 = no KL, and no reference forward at all)"""
    kl_in_reward: bool = False
    """put the KL penalty in the token rewards (PPO-style) instead of the loss (GRPO-style); every
    estimator sees it (outcome estimators score a turn by the sum of its token rewards)"""
    kl_adaptive: bool = False
    """adapt the KL coefficient towards kl_target (Ziegler et al.)"""
    kl_target: float = 0.1
    """target KL for the adaptive controller"""
    kl_horizon: int = 10000
    """horizon of the adaptive controller"""
    entropy_coef: float = 0.0
    """entropy bonus coefficient"""
    ppo_epochs: int = 1
    """passes over each rollout batch"""
    mini_batch_size: int = 64
    """sequences (turns) per optimizer step, per role"""
    micro_batch_size: int = 8
    """sequences per forward/backward (gradient accumulation inside a mini-batch)"""
    fused_update: bool = True
    """one forward/backward per micro-batch for every adapter's rows (each row wearing its own
    adapter), then each adapter's own optimizer step: the same weights as updating the adapters
    one after another (False: that sequential reference), in fewer, fuller forwards"""
    grad_clip: float = 1.0
    """max gradient norm per adapter"""
    lr: float = 1e-5
    """AdamW learning rate of every adapter"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    warmup_steps: int = 0
    """linear LR warm-up steps"""
    dynamic_sampling: bool = False
    """DAPO's filter: groups (task, role) whose rewards all agree teach nothing and leave the batch
    (their tokens leave every denominator); singleton groups stay unless the estimator is grouped"""
    dynamic_sampling_max_rounds: int = 0
    """with dynamic_sampling: roll out up to this many extra batches of new tasks while fewer than
    data.batch_size tasks kept an informative group (DAPO's refill); 0 = filter only"""
    vf_coef: float = 0.5
    """GAE: value loss coefficient"""
    vf_clip: float | None = 0.2
    """GAE: value clip range (None = unclipped)"""
    critic_lr: float = 1e-4
    """GAE: critic learning rate (value head + critic adapter)"""
    critic_warmup_steps: int = 0
    """GAE: steps that train only the critic before the policy starts"""
    recompute_old_logprobs: Literal["auto", "always", "never"] = "auto"
    """auto: use the engine's sampling logprobs as the old policy when they equal the trainer's
    (TorchEngine, fp32, no top-k/top-p), else recompute; the gap is logged when recomputed"""

    # the loss's settings with the defaults of the chosen loss filled in (None = that default)
    @property
    def clip(self) -> tuple[float, float]:
        lo, hi = (3e-4, 4e-4) if self.policy_loss == "gspo" else (0.2, 0.28)
        return (lo if self.clip_low is None else self.clip_low, hi if self.clip_high is None else self.clip_high)

    @property
    def agg(self) -> str:
        return self.loss_agg or ("seq-mean-token-mean" if self.policy_loss == "gspo" else "token-mean")


@dataclass
class RolloutConfig:
    engine: Literal["torch", "vllm"] = "torch"
    """torch = embedded TorchEngine (CPU/GPU); vllm = vLLM in process"""
    num_chains: int = 4
    """episodes per task (the group size of GRPO/RLOO)"""
    max_turns: int = 8
    """max model turns per episode"""
    top_p: float = 1.0
    """nucleus sampling in training rollouts"""
    top_k: int = 0
    """top-k sampling in training rollouts (0 = off)"""
    max_model_len: int = 2048
    """prompt + completion limit per turn; longer episodes end truncated"""
    max_batch_size: int = 64
    """TorchEngine rows per forward"""
    compile: bool = False
    """TorchEngine on CUDA: static-shape decode steps captured in CUDA graphs and replayed (gpt-fast
    style; README "GPU path"). An error on CPU, where there is nothing to capture"""
    vllm_gpu_memory_utilization: float = 0.4
    """vLLM's share of GPU memory (the trainer needs the rest)"""
    progress: bool = True
    """progress bars on rank 0 (stderr): rollout and eval episodes, the update over adapters"""
    merge_turns: bool = False
    """train a role's consecutive turns of one episode as one sequence when each prompt extends the
    last (tool agents); observations and other roles' tokens are masked out"""


@dataclass
class DataConfig:
    env: str = "math_3agent"
    """workflow: a built-in (math_3agent, math_single, math_tool, code, search, react, research, swe, toy: one
    speaker rewarded for digits, what a random model can learn) or your own as `module:Class` or
    `path/to/file.py:Class` (README "Add a workflow": nothing else in troupe changes)"""
    env_kwargs: dict[str, int | float | bool | str] = field(default_factory=dict)
    """keyword arguments for your own workflow's class (a `module:Class` env)"""
    train_files: str = "data/arith_train.jsonl"
    """training tasks: a .jsonl/.json file or a HF dataset name"""
    val_files: str = "data/arith_val.jsonl"
    """validation tasks"""
    batch_size: int = 8
    """tasks per training step (each rolled out num_chains times)"""
    val_size: int | None = 64
    """validation tasks used (None = all)"""
    levels: tuple[int, ...] | None = None
    """keep only tasks whose 'level' field is listed (the shipped arithmetic data has levels 1-5)"""
    max_refinement_iterations: int = 3
    """refinement cycles before an episode ends (math_3agent, math_tool, code, search)"""
    reward: Literal["env", "calculator"] = "env"
    """training reward of every turn: the workflow's own (env), or rewards/calculator.py's weighted
    components (completion, efficiency, quality, reasoning) computed on the finished episode; the
    env's reward stays in the trajectory files as env_reward, and val always reports the env's"""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """calculator weights by component (unnamed ones keep completion 0.4, efficiency 0.2, quality
    0.3, reasoning 0.1); read by reward="calculator" and by sft.py / rewards.calculator --config"""
    agent_style: Literal["chat", "react", "code"] = "react"
    """react env: plain chat, ReAct (Thought/Action/Observation) or code-acting"""
    tools: tuple[str, ...] = ("calculator",)
    """react env: tools offered by name (calculator, python, search over data.corpus, answer)"""
    agent_reward: str = "math"
    """react env: the reward by name: math, qa_f1, qa_em (the final answer against the task's), code
    (the share of the task's tests the agent's last function passes, in the sandbox)"""
    corpus: str = "data/search_corpus.jsonl"
    """search env: the documents BM25 searches"""
    search_k: int = 3
    """search env: passages per query"""


@dataclass
class TrainerConfig:
    total_steps: int = 100
    """training steps (ignored when total_epochs is set)"""
    total_epochs: int | None = None
    """epochs over the training tasks (overrides total_steps)"""
    save_freq: int = 50
    """checkpoint every N steps (and at the end); 0 = only at the end"""
    keep_checkpoints: int = 2
    """complete checkpoints kept on disk"""
    test_freq: int = 25
    """greedy validation every N steps (and at the end); 0 = never"""
    val_before_train: bool = True
    """validate once before the first step"""
    resume: str = "auto"
    """auto (newest complete checkpoint in output_dir), none, or a checkpoint path"""
    resume_if_changed: bool = False
    """resume even when this config differs from the checkpoint's (beyond the run's length, eval,
    logging and checkpoint settings); without it such a resume stops and lists the fields"""
    eval_only: bool = False
    """load the checkpoint given by resume, validate once, exit"""
    output_dir: str = "runs/default"
    """run directory: metrics.jsonl, checkpoints, rewards.png"""
    seed: int = 0
    """seed of everything: model init (tiny), data order, sampling, dropout"""
    trajectory_sample: float = 0.25
    """fraction of each step's training episodes written to runs/X/trajectories/ (every validation
    episode is written at each eval); 0 = none. The format: trajectories.py"""
    max_empty_steps: int = 3
    """stop with an error after this many steps in a row that train on nothing (every episode
    truncated, or no role produced a token): each such step is logged with its reason"""
    logger: tuple[str, ...] = ("console",)
    """console and/or wandb (set WANDB_MODE=offline without network)"""
    wandb_project: str = "troupe"
    """wandb project name"""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    roles: tuple[RoleConfig, ...] = (RoleConfig("generator_initial"), RoleConfig("evaluator_critique"),
                                     RoleConfig("generator_refinement"))
    """the roles of the workflow, each with its adapter and sampling"""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    mode: Literal["rl", "sft", "both"] = "rl"
    """rl: reinforcement learning; sft: sft.py's pipeline (sft_config) into <output_dir>/sft, then
    stop; both: that SFT, then RL with every role SFT wrote an adapter for starting from it (init_from)"""
    sft_config: str | None = None
    """for mode sft/both: an sft.py config file (`config = SFTConfig(...)`); its train_config is this config"""

    # derived ---------------------------------------------------------------------------------
    def adapter_of(self, role: RoleConfig) -> str:
        return role.adapter or role.name

    @property
    def adapters(self) -> list[str]:
        return sorted({self.adapter_of(r) for r in self.roles})

    @property
    def trainable_adapters(self) -> list[str]:
        return sorted({self.adapter_of(r) for r in self.roles if r.trainable})

    def validate(self) -> "Config":
        """Check every field before anything expensive happens; errors name the field."""
        import math
        import warnings

        def bad(name, msg):
            raise ConfigError(f"config field {name}: {msg}")

        def floats(obj, name):  # every number of every field: NaN is never a setting
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
        for name, v in floats(self, ""):
            if math.isnan(v):
                bad(name, "is NaN")
        if not self.roles:
            bad("roles", "at least one role is needed")
        if len({r.name for r in self.roles}) != len(self.roles):
            bad("roles", "role names must be unique")
        for i, r in enumerate(self.roles):
            if r.max_tokens < 1:
                bad(f"roles[{i}].max_tokens", f"must be >= 1, got {r.max_tokens}")
            if not (r.temperature > 0 and math.isfinite(r.temperature)):
                bad(f"roles[{i}].temperature", f"must be a finite number > 0, got {r.temperature}")
            same = [o for o in self.roles if self.adapter_of(o) == self.adapter_of(r)]
            if any(o.trainable != r.trainable for o in same):
                bad(f"roles[{i}].trainable", f"roles sharing adapter {self.adapter_of(r)!r} disagree on trainable")
            if any(o.init_from != r.init_from for o in same):
                bad(f"roles[{i}].init_from", f"roles sharing adapter {self.adapter_of(r)!r} disagree on init_from")
            if r.init_from is not None:
                d = Path(r.init_from)
                if not (d / "adapter_config.json").is_file() or not (d / "adapter_model.safetensors").is_file():
                    bad(f"roles[{i}].init_from", f"{d} is not a PEFT adapter directory (adapter_config.json + "
                        "adapter_model.safetensors)")
                try:
                    t = json.loads((d / "adapter_config.json").read_text())["target_modules"]
                except (ValueError, KeyError, TypeError) as e:
                    bad(f"roles[{i}].init_from", f"{d / 'adapter_config.json'} is unreadable: {e}")
                if set([t] if isinstance(t, str) else t) != set(self.lora.targets):
                    bad(f"roles[{i}].init_from", f"{d} adapts {sorted(t)}, lora.targets is {sorted(self.lora.targets)}: "
                        "every adapter must sit on the same modules (mixed-adapter batches)")
                base = json.loads((d / "adapter_config.json").read_text()).get("base_model_name_or_path")
                same = lambda x, y: str(x).rstrip("/").rsplit("/", 1)[-1].lower() == str(y).rstrip("/").rsplit("/", 1)[-1].lower()  # noqa: E731
                if base and not same(base, self.model.spec):
                    warnings.warn(f"config field roles[{i}].init_from: {d} was trained on base model {base!r}, but "
                                  f"model.spec is {self.model.spec!r}: the adapter may not fit this model", stacklevel=2)
        if not self.trainable_adapters:
            bad("roles", "every role has trainable=False: nothing would train")
        if self.rollout.compile:
            import torch
            if self.rollout.engine != "torch" or not torch.cuda.is_available():
                bad("rollout.compile", "captures TorchEngine's decode step in CUDA graphs: it needs rollout.engine="
                    f"torch and a CUDA device (engine {self.rollout.engine!r}, CUDA available: {torch.cuda.is_available()})")
        if self.mode != "rl":
            if self.sft_config is None:
                bad("sft_config", f"mode={self.mode!r} needs an sft.py config file (`config = SFTConfig(...)`, e.g. "
                    "configs/sft/tiny_math.py): what SFT learns from")
            if not Path(self.sft_config).is_file():
                bad("sft_config", f"{self.sft_config} is not a file")
        if self.data.reward == "calculator" and self.algo.adv_estimator == "remax":
            bad("data.reward", "remax's greedy baseline episode is scored by the env, not the calculator: "
                "use data.reward=env with remax")
        if self.data.reward_weights:
            from rewards.calculator import RewardCalculator
            try:
                RewardCalculator(dict(self.data.reward_weights))
            except ValueError as e:
                bad("data.reward_weights", str(e))
        a, ro, t = self.algo, self.rollout, self.trainer
        for name, v, lo in [("algo.mini_batch_size", a.mini_batch_size, 1), ("algo.micro_batch_size", a.micro_batch_size, 1),
                            ("algo.ppo_epochs", a.ppo_epochs, 1), ("lora.rank", self.lora.rank, 1),
                            ("rollout.num_chains", ro.num_chains, 1), ("data.batch_size", self.data.batch_size, 1),
                            ("rollout.max_turns", ro.max_turns, 1), ("rollout.max_batch_size", ro.max_batch_size, 1),
                            ("rollout.max_model_len", ro.max_model_len, 2), ("trainer.total_steps", t.total_steps, 1),
                            ("trainer.keep_checkpoints", t.keep_checkpoints, 1), ("trainer.save_freq", t.save_freq, 0),
                            ("trainer.test_freq", t.test_freq, 0), ("trainer.max_empty_steps", t.max_empty_steps, 1),
                            ("algo.dynamic_sampling_max_rounds", a.dynamic_sampling_max_rounds, 0),
                            ("algo.warmup_steps", a.warmup_steps, 0), ("data.search_k", self.data.search_k, 1)]:
            if v < lo:
                bad(name, f"must be >= {lo}, got {v}")
        for name, v in [("algo.lr", a.lr), ("algo.critic_lr", a.critic_lr), ("algo.grad_clip", a.grad_clip),
                        ("lora.alpha", self.lora.alpha)]:
            if not (math.isfinite(v) and v > 0):
                bad(name, f"must be a finite number > 0, got {v}")
        for name, v in [("algo.kl_coef", a.kl_coef), ("algo.entropy_coef", a.entropy_coef), ("algo.vf_coef", a.vf_coef),
                        ("algo.weight_decay", a.weight_decay)]:
            if not (math.isfinite(v) and v >= 0):
                bad(name, f"must be a finite number >= 0, got {v}")
        for name, v in [("algo.gamma", a.gamma), ("algo.lam", a.lam)]:
            if not 0 <= v <= 1:
                bad(name, f"must be in [0, 1], got {v}")
        if not 0 <= t.trajectory_sample <= 1:
            bad("trainer.trajectory_sample", f"must be in [0, 1], got {t.trajectory_sample}")
        if not 0 <= self.lora.dropout < 1:
            bad("lora.dropout", f"must be in [0, 1), got {self.lora.dropout}")
        if not 0 < ro.top_p <= 1:
            bad("rollout.top_p", f"must be in (0, 1], got {ro.top_p}")
        if ro.top_k < 0:
            bad("rollout.top_k", f"must be >= 0 (0 = off), got {ro.top_k}")
        if not 0 < ro.vllm_gpu_memory_utilization <= 1:
            bad("rollout.vllm_gpu_memory_utilization", f"must be in (0, 1], got {ro.vllm_gpu_memory_utilization}")
        lo, hi = a.clip
        if not (0 < lo < 1 and hi > 0):
            bad("algo.clip_low/clip_high", f"need 0 < clip_low < 1 and clip_high > 0, got {lo}, {hi}")
        if a.dual_clip is not None and not (math.isfinite(a.dual_clip) and a.dual_clip > 1):
            bad("algo.dual_clip", f"must be a finite number > 1 (or None), got {a.dual_clip}")
        if a.vf_clip is not None and not (math.isfinite(a.vf_clip) and a.vf_clip > 0):
            bad("algo.vf_clip", f"must be a finite number > 0 (or None), got {a.vf_clip}")
        if not math.isfinite(a.kl_target) or (a.kl_adaptive and a.kl_target <= 0):
            bad("algo.kl_target", f"must be a finite number (> 0 for the adaptive controller), got {a.kl_target}")
        if t.total_epochs is not None and t.total_epochs < 1:
            bad("trainer.total_epochs", f"must be >= 1 (or None: total_steps), got {t.total_epochs}")
        if a.kl_kind != "full" and a.kl_kind.rstrip("+") not in ("kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3"):
            bad("algo.kl_kind", f"unknown kind {a.kl_kind!r}: kl, abs, mse, low_var_kl (k1/k2/k3, optionally +) or full")
        if a.kl_adaptive and a.kl_horizon <= 0:
            bad("algo.kl_horizon", f"the adaptive KL controller needs it > 0, got {a.kl_horizon}")

        if a.adv_estimator in ("grpo", "rloo", "reinforce++_baseline") and ro.num_chains < 2:
            bad("rollout.num_chains", f"{a.adv_estimator} needs groups: num_chains >= 2")
        if t.logger and not set(t.logger) <= {"console", "wandb"}:
            bad("trainer.logger", f"use console and/or wandb, got {t.logger}")
        if self.data.val_size is not None and self.data.val_size < 1:
            bad("data.val_size", f"must be >= 1 or None, got {self.data.val_size}")
        builtin = ("math_3agent", "math_single", "math_tool", "code", "search", "react", "research", "swe", "toy")
        if self.data.env not in builtin and ":" not in self.data.env:
            bad("data.env", f"unknown workflow {self.data.env!r}: one of {builtin}, or module:Class / file.py:Class")
        if self.data.env_kwargs and ":" not in self.data.env:
            bad("data.env_kwargs", "only for a module:Class workflow (built-ins take their own data.* fields)")
        from envs.react import REWARDS  # the react env's names (checked whatever the env: a typo is an error)
        from envs.tools import TOOL_NAMES
        if unknown := [x for x in self.data.tools if x not in TOOL_NAMES]:
            bad("data.tools", f"unknown tool(s) {unknown}: choose from {TOOL_NAMES}")
        if self.data.agent_reward not in REWARDS:
            bad("data.agent_reward", f"unknown reward {self.data.agent_reward!r}: choose from {tuple(REWARDS)}")
        for name, path in [("data.train_files", self.data.train_files), ("data.val_files", self.data.val_files)] + (
                [("data.corpus", self.data.corpus)] if self.data.env in ("search", "research") or "search" in self.data.tools else []):
            looks_local = path.endswith((".jsonl", ".json", ".parquet")) or path.startswith((".", "/"))
            if Path(path).is_dir():
                bad(name, f"{path} is a directory, not a data file")
            if looks_local and not Path(path).is_file():
                bad(name, f"{path} does not exist")
        if t.resume not in ("auto", "none") and not (Path(t.resume) / "trainer_state.pt").is_file():
            bad("trainer.resume", f"{t.resume} is not a checkpoint directory (no trainer_state.pt); "
                "use auto, none, or a runs/X/checkpoints/step_N directory")
        if t.eval_only and t.resume == "none":
            bad("trainer.eval_only", "needs a checkpoint: set trainer.resume to auto or a checkpoint path")
        return self


def pop_config_arg(argv: list[str]) -> tuple[str | None, list[str]]:
    """`--config PATH` or `--config=PATH` out of a command line -> (PATH or None, the other args)."""
    for i, x in enumerate(argv):
        if x == "--config" or x.startswith("--config="):
            path = x.split("=", 1)[1] if "=" in x else (argv[i + 1] if i + 1 < len(argv) else None)
            if not path:
                raise SystemExit("--config needs a path")
            return path, argv[:i] + argv[i + (1 if "=" in x else 2):]
    return None, list(argv)


def load_config_file(path: str) -> Config:
    """Execute a config file and return its `config` (a Config instance)."""
    spec = importlib.util.spec_from_file_location("troupe_config", path)
    if spec is None:
        raise FileNotFoundError(f"config file {path} does not exist")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"config file {path} does not exist") from e
    cfg = getattr(mod, "config", None)
    if not isinstance(cfg, Config):
        raise TypeError(f"{path} must define `config = Config(...)`, found {type(cfg).__name__}")
    return cfg


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(d: dict) -> Config:
    """Inverse of to_dict: rebuild the Config a checkpoint's config.json was written from."""
    def build(cls, values):
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in values:
                continue  # a field added since: keep its default
            v = values[f.name]
            if f.name == "roles":
                v = tuple(RoleConfig(**r) for r in v)
            elif dataclasses.is_dataclass(f.default_factory() if callable(f.default_factory) else None):
                v = build(type(f.default_factory()), v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)
    return build(Config, d)

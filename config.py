"""troupe's configuration: nested dataclasses, a docstring under every field (tyro shows them in
`python train.py --help`). A config file under configs/ builds one `Config` named `config`;
`train.py --config configs/X.py --algo.adv-estimator rloo` applies CLI overrides on top.
Derived values are properties, not fields. `Config.validate()` names the bad field.

Kept apart from train.py so that config files can import it without importing the trainer.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Literal


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
    """LoRA adapter this role wears; None = its own adapter named after the role"""
    max_tokens: int = 256
    """max new tokens per turn of this role"""
    temperature: float = 1.0
    """sampling temperature in training rollouts (eval is greedy)"""
    trainable: bool = True
    """False freezes this role's adapter (the 'separate' training mode)"""


@dataclass
class LoRAConfig:
    rank: int = 64
    """LoRA rank. RL updates are low-rank: rank 8-64 match full fine-tuning in RL studies
    (Schulman & Thinking Machines, 'LoRA Without Regret', 2025), so small ranks are fine"""
    alpha: float = 16.0
    """LoRA alpha; the update is scaled by alpha / rank"""
    dropout: float = 0.05
    """dropout on the adapter input, training only"""
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
    """token-level PPO clip, or GSPO's sequence-level ratio"""
    clip_low: float = 0.2
    """PPO epsilon below 1 (GSPO: use ~3e-4)"""
    clip_high: float = 0.28
    """PPO epsilon above 1 ('clip-higher', DAPO; GSPO: ~4e-4)"""
    dual_clip: float | None = 3.0
    """dual-clip constant c for negative advantages (None = off)"""
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """how per-token losses are aggregated"""
    kl_kind: str = "low_var_kl"
    """kl (k1), abs, mse (k2), low_var_kl (k3), optionally with '+' (straight-through k1 gradient)"""
    kl_coef: float = 0.0
    """KL coefficient (0 = no KL, and no reference forward at all)"""
    kl_in_reward: bool = False
    """put the KL penalty in the token rewards (PPO-style) instead of the loss (GRPO-style)"""
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
    grad_clip: float = 1.0
    """max gradient norm per adapter"""
    lr: float = 1e-5
    """AdamW learning rate of every adapter"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    warmup_steps: int = 0
    """linear LR warm-up steps"""
    training_mode: Literal["joint", "separate", "shared"] = "joint"
    """joint: every trainable role trains its own adapter; separate: roles with trainable=False stay
    frozen; shared: all roles wear ONE adapter (the parameter-sharing baseline)"""
    dynamic_sampling: bool = False
    """drop groups whose rewards have zero variance from the update (DAPO)"""
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
    vllm_gpu_memory_utilization: float = 0.4
    """vLLM's share of GPU memory (the trainer needs the rest)"""
    progress: bool = True
    """progress bar during rollouts"""
    merge_turns: bool = False
    """train a role's consecutive turns of one episode as one sequence when each prompt extends the
    last (tool agents); observations and other roles' tokens are masked out"""


@dataclass
class DataConfig:
    env: Literal["math_3agent", "math_single", "math_tool", "code", "search", "react"] = "math_3agent"
    """workflow (envs/): math_3agent, math_single, math_tool, code (HumanEval), search, react (one tool agent)"""
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
    agent_style: Literal["chat", "react", "code"] = "react"
    """react env: plain chat, ReAct (Thought/Action/Observation) or code-acting"""
    tools: tuple[str, ...] = ("calculator",)
    """react env: tools offered (calculator, python)"""
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
    eval_only: bool = False
    """load the checkpoint given by resume, validate once, exit"""
    output_dir: str = "runs/default"
    """run directory: metrics.jsonl, checkpoints, rewards.png"""
    seed: int = 0
    """seed of everything: model init (tiny), data order, sampling, dropout"""
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

    # derived ---------------------------------------------------------------------------------
    def adapter_of(self, role: RoleConfig) -> str:
        return "shared" if self.algo.training_mode == "shared" else (role.adapter or role.name)

    @property
    def adapters(self) -> list[str]:
        return sorted({self.adapter_of(r) for r in self.roles})

    @property
    def trainable_adapters(self) -> list[str]:
        if self.algo.training_mode == "shared":
            return ["shared"]
        frozen = {self.adapter_of(r) for r in self.roles if not r.trainable} if self.algo.training_mode == "separate" else set()
        return [a for a in self.adapters if a not in frozen]

    def validate(self) -> "Config":
        def bad(name, msg):
            raise ValueError(f"config field {name}: {msg}")
        if not self.roles:
            bad("roles", "at least one role is needed")
        if len({r.name for r in self.roles}) != len(self.roles):
            bad("roles", "role names must be unique")
        for i, r in enumerate(self.roles):
            if r.max_tokens < 1:
                bad(f"roles[{i}].max_tokens", f"must be >= 1, got {r.max_tokens}")
            if r.temperature <= 0:
                bad(f"roles[{i}].temperature", f"must be > 0, got {r.temperature}")
        a = self.algo
        for name, v, lo in [("algo.mini_batch_size", a.mini_batch_size, 1), ("algo.micro_batch_size", a.micro_batch_size, 1),
                            ("algo.ppo_epochs", a.ppo_epochs, 1), ("lora.rank", self.lora.rank, 1),
                            ("rollout.num_chains", self.rollout.num_chains, 1), ("data.batch_size", self.data.batch_size, 1),
                            ("rollout.max_turns", self.rollout.max_turns, 1)]:
            if v < lo:
                bad(name, f"must be >= {lo}, got {v}")
        if a.lr <= 0:
            bad("algo.lr", f"must be > 0, got {a.lr}")
        if a.kl_kind.rstrip("+") not in ("kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3"):
            bad("algo.kl_kind", f"unknown kind {a.kl_kind!r}")
        if a.adv_estimator in ("grpo", "rloo", "reinforce++_baseline") and self.rollout.num_chains < 2:
            bad("rollout.num_chains", f"{a.adv_estimator} needs groups: num_chains >= 2")
        if a.training_mode == "separate" and not any(r.trainable for r in self.roles):
            bad("roles", "separate mode with every role frozen trains nothing")
        if self.trainer.logger and not set(self.trainer.logger) <= {"console", "wandb"}:
            bad("trainer.logger", f"use console and/or wandb, got {self.trainer.logger}")
        return self


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
    """Inverse of to_dict (for checkpoints)."""
    kw = dict(d)
    kw["roles"] = tuple(RoleConfig(**r) for r in d["roles"])
    for name, cls in [("model", ModelConfig), ("lora", LoRAConfig), ("algo", AlgoConfig), ("rollout", RolloutConfig),
                      ("data", DataConfig), ("trainer", TrainerConfig)]:
        sub = dict(d[name])
        for k, v in sub.items():
            if isinstance(v, list):
                sub[k] = tuple(v)
        kw[name] = cls(**sub)
    return Config(**kw)

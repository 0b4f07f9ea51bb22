"""troupe's configuration: nested dataclasses, a docstring under every field (tyro shows them in
`python train.py --help`). A config file under configs/ builds one `Config` named `config`;
`train.py --config configs/X.py --algo.adv-estimator rloo` applies CLI overrides on top.
Derived values are properties, not fields. `Config.validate()` names the bad field: each section checks its
own fields here, and what spans sections (options that cannot run together) is in config_rules.py.

Kept apart from train.py so that config files can import it without importing the trainer.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from config_rules import (MAX_LR, MAX_SEED, MAX_THREADS, MIN_TEMPERATURE, ConfigError, at_least, bad, check_across,
                          check_name, check_roles, finite, no_nan)


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
    be this role's targets. A checkpoint being resumed overrides it"""
    lr: float | None = None
    """this role's AdamW learning rate (None: algo.lr), e.g. a lower one for an SFT'd judge"""
    rank: int | None = None
    """LoRA rank of this role's adapter (None: lora.rank)"""
    alpha: float | None = None
    """LoRA alpha of this role's adapter (None: lora.alpha)"""
    targets: tuple[str, ...] | None = None
    """LoRA target modules of this role's adapter (None: lora.targets); adapters with other targets
    still share every forward (lora.py)"""
    adv_estimator: str | None = None
    """advantage estimator of this role's turns (None: algo.adv_estimator), e.g. a judge whose verdicts
    across chains are no natural GRPO group on reinforce++_baseline while the solvers use grpo"""
    frozen_steps: int = 0
    """the role acts but its adapter is not updated for the first this-many training steps (e.g. keep an
    SFT'd judge as it is while the solvers it judges improve)"""
    train_windows: tuple[tuple[int, int], ...] | None = None
    """train this role's adapter only at the training steps inside these inclusive windows, e.g. ((1, 8),
    (17, 24)) for the generator and ((9, 16),) for the judge: one role learns while the other holds still
    (PettingLLMs' alternating phases; co-evolution "stagewise"); it acts at every step. None = every step
    (after frozen_steps). A function of the step, so a resumed run keeps the schedule exactly"""
    team_reward_weight: float = 0.0
    """alpha in [0, 1]: this role's training reward is alpha * the episode's team reward (its env's
    metrics()["team_reward"]) + (1 - alpha) * its own turn's reward (MAPoRL / Dr.MAS-style reward mixing); 0 =
    its own reward only. The logged train/reward/<role> stays its own; the mixed one is what its advantages
    are computed from (learner.mix_team_reward)"""
    balance_labels: bool = False
    """weight this role's labelled turns (env.turn_labels, e.g. the truth of what a judge judged) so that
    each label carries equal total weight in the step's update: on a 9:1 batch a judge that approves
    everything gets zero net push (GenRM trains verifiers on a balanced mix). Logged per label:
    labelled_<label> (turns) and reward_<label> (mean reward)"""



    def check(self, i: int, targets: tuple[str, ...], base_spec: str):
        """This role's own fields; targets: its adapter's (its own or lora's), base_spec: model.spec."""
        import warnings
        where = f"roles[{i}]"
        check_name(self.name, f"config field {where}.name")
        if self.max_tokens < 1:
            bad(f"{where}.max_tokens", f"must be >= 1, got {self.max_tokens}")
        if not (MIN_TEMPERATURE <= self.temperature and math.isfinite(self.temperature)):
            bad(f"{where}.temperature", f"must be a finite number >= {MIN_TEMPERATURE}, got {self.temperature}")
        if self.lr is not None and not (0 < self.lr <= MAX_LR):
            bad(f"{where}.lr", f"must be in (0, {MAX_LR}] (or None: algo.lr), got {self.lr}")
        if self.rank is not None and self.rank < 1:
            bad(f"{where}.rank", f"must be >= 1 (or None: lora.rank), got {self.rank}")
        if self.alpha is not None and not (math.isfinite(self.alpha) and self.alpha > 0):
            bad(f"{where}.alpha", f"must be a finite number > 0 (or None: lora.alpha), got {self.alpha}")
        if self.targets is not None and not self.targets:
            bad(f"{where}.targets", "must name at least one module (or None: lora.targets)")
        for t in self.targets or ():  # the model's own names are checked once it loads (session.build)
            if not isinstance(t, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t):
                bad(f"{where}.targets", f"{str(t)[:80]!r} is not a module name")
        if self.frozen_steps < 0:
            bad(f"{where}.frozen_steps", f"must be >= 0, got {self.frozen_steps}")
        if not (isinstance(self.team_reward_weight, (int, float)) and 0 <= self.team_reward_weight <= 1):
            bad(f"{where}.team_reward_weight", f"must be in [0, 1], got {self.team_reward_weight}")
        for w in self.train_windows or ():
            if not (len(w) == 2 and all(isinstance(x, int) for x in w) and 1 <= w[0] <= w[1]):
                bad(f"{where}.train_windows", f"each window is (first step, last step) with 1 <= first <= last, got {w}")
        if self.init_from is None:
            return
        d = Path(self.init_from)
        if not (d / "adapter_config.json").is_file() or not (d / "adapter_model.safetensors").is_file():
            bad(f"{where}.init_from", f"{d} is not a PEFT adapter directory (adapter_config.json + "
                 "adapter_model.safetensors)")
        try:
            conf = json.loads((d / "adapter_config.json").read_text())
            t = conf["target_modules"]
        except (ValueError, KeyError, TypeError) as e:
            bad(f"{where}.init_from", f"{d / 'adapter_config.json'} is unreadable: {e}")
        if set([t] if isinstance(t, str) else t) != set(targets):
            bad(f"{where}.init_from", f"{d} adapts {sorted(t)}, the role's targets are {sorted(targets)} "
                 f"({where}.targets, else lora.targets): set them to the adapter's")
        base = conf.get("base_model_name_or_path")
        same = lambda x, y: str(x).rstrip("/").rsplit("/", 1)[-1].lower() == str(y).rstrip("/").rsplit("/", 1)[-1].lower()  # noqa: E731
        if base and not same(base, base_spec):
            warnings.warn(f"config field {where}.init_from: {d} was trained on base model {base!r}, but "
                          f"model.spec is {base_spec!r}: the adapter may not fit this model", stacklevel=3)

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
    not 1 on policy (tests/test_rl_core.py checks it is exactly 1 with lora.dropout > 0)"""
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """projection names to adapt. The 3-agent design uses attention only; RL evidence favours all
    linear layers (add gate_proj, up_proj, down_proj) with a ~10x higher LR than full fine-tuning"""



    def check(self):
        at_least("lora", [("rank", self.rank, 1)])
        finite("lora", [("alpha", self.alpha)], positive=True)
        if not 0 <= self.dropout < 1:
            bad("lora.dropout", f"must be in [0, 1), got {self.dropout}")

@dataclass
class AlgoConfig:
    adv_estimator: str = "grpo"
    """advantage estimator, a name in ppo.ADVANTAGES: grpo, rloo, reinforce++, reinforce++_baseline, remax,
    gae, ema_baseline, or one you add there (see ppo.py's docstring for when to use which)"""
    estimator_kwargs: dict[str, int | float | bool | str] = field(default_factory=dict)
    """keyword settings of a stateful estimator's class (a ppo.StatefulEstimator: ema_baseline's decay, default
    0.9), passed to the instance the run builds for each adapter that uses it. On the command line
    `--algo.estimator-kwargs decay 0.5` (KEY VALUE pairs, replacing the file's); a key the estimator does not
    take, a value it refuses, or settings with no stateful estimator in use is a config error"""
    norm_by_std: bool = True
    """GRPO: divide by the group std (False = Dr. GRPO)"""
    gamma: float = 1.0
    """discount (reinforce++, gae)"""
    lam: float = 1.0
    """GAE lambda"""
    group_by_turn: bool = False
    """group samples by (task, role, turn) instead of (task, role): each turn is centred among the same turn
    of its task's other chains. This is AT-GRPO's agent- and turn-wise grouping (arXiv 2510.11062,
    PettingLLMs), one name for both; its tree-style sampling (several candidates per turn from one state, the
    best going on) is rollout.tree_sampling. The turn is the env's Prompt.key where it sets one (research: the sub-question
    and round), else the role's turn count in the episode (its k-th turn); a merged turn keeps its first turn's"""
    norm_adv_by_role: bool = False
    """per-role advantage normalisation (Dr.MAS, arXiv 2602.08847; PAG's RoleAdvNorm): after the estimator,
    each role's advantages are whitened by that role's own mean and std over its generated tokens in the step
    (every rank's), whether roles share an adapter or not, so a role whose rewards spread widely cannot
    dominate the gradient of the others through one shared scale. It is verl's masked_whiten per role, over tokens,
    so it also re-centres and rescales what the estimator gave: where most of a role's groups are flat (every
    advantage 0, common for a small model near the floor), that role's spread falls below 1 and its step grows
    (reason_code, arm rc-rn: the coder's gradient norm 2.4x the run without it at step 1, on the same batch), and
    the turns of flat groups, which had no signal, take the step's token-weighted mean as a push
    (docs/experiments.md, rc-rn)"""
    policy_loss: str = "ppo"
    """a name in ppo.LOSSES: ppo (token-level PPO clip) or gspo (GSPO's sequence-level ratio, which brings
    GSPO's own defaults for the clip range, 3e-4 / 4e-4, and loss_agg seq-mean-token-mean, unless you set them)"""
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
    """kl (k1), abs, mse (k2), low_var_kl (k3), optionally with '+' (the named value with k2's gradient,
    (logp - ref) grad logp, unbiased for grad KL(pi || ref): use it when the KL is in the loss),
    or full (exact KL over the vocabulary: one more no-grad forward per micro-batch)"""
    kl_coef: float = 0.0
    """KL coefficient (0 = no KL, and no reference forward at all)"""
    kl_ref: Literal["base", "init"] = "base"
    """the KL's reference policy. base: the model with adapters off (what verl and TRL do with LoRA: the
    reference is the base under a disabled adapter). init: each adapter where the run started, i.e. a role's
    init_from adapter (sft.py's output), kept as a frozen copy, so the KL anchors RL to the SFT policy
    rather than to the model before SFT; a fresh adapter starts as the identity, so its reference is the
    base either way. Only for trainable roles, only in train.py (eval.py and play.py never build it). Costs one
    frozen adapter per init_from adapter: its rank in every per-row routed forward, the rollout's included"""
    kl_in_reward: bool = False
    """put the KL penalty in the token rewards (PPO-style) instead of the loss (GRPO-style); every
    estimator sees it (outcome estimators score a turn by the sum of its token rewards)"""
    kl_adaptive: bool = False
    """adapt the in-reward KL coefficient towards kl_target (Ziegler et al.; needs kl_in_reward), fed as
    verl feeds it: the mean over the step's sequences of each one's token-mean KL, n_steps = their number"""
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
    micro_batch_tokens: int | None = None
    """also cap each forward/backward at this many padded tokens (rows x the longest row, prompt included:
    what memory and time scale with), verl's dynamic batch size: short turns go many to a micro-batch, long
    ones few; a row longer than the cap gets a micro-batch of its own. None: rows only (micro_batch_size)"""
    logits_chunk_tokens: int = 256
    """the update's vocabulary projection (old and new logprobs, entropy) runs this many tokens at a time, each
    chunk recomputed in backward, so no micro-batch ever holds its whole (tokens x vocabulary) logits with their
    fp32 copy and gradients (~12 bytes a token and vocabulary entry: 60 GB at 8 x 4,096 tokens and Qwen's 152k
    vocabulary), for one more pass of the head's matmul in backward (ppo.HeadLogprobs; bench/logits_chunk.py on
    CPU: 0.36x the update's peak at 1.06x its time for 4-row micro-batches, 0.17x at 0.72x for 8 rows of ~300
    tokens). 0 = whole logits (the reference). Whole logits anyway for kl_kind full and a LoRA on lm_head"""
    pack_turns: bool = True
    """turns of one adapter that extend one another (a later turn's prompt starts with an earlier turn's
    prompt + reply: a tool agent's next step, a researcher's next round, another role on a shared adapter
    whose prompt continues that conversation) share one row in the update's forwards (old and reference
    logprobs, the policy loss): each token is read once. Each turn keeps its own reward, advantage and
    mask (advantages are computed per turn before packing, so remax's per-turn baseline is unchanged),
    and the loss over one mini-batch equals the unpacked one. Used only where that holds: policy_loss
    ppo with loss_agg token-mean (a seq-mean or GSPO's sequence ratio would treat a conversation as one
    sequence); the critic (gae) reads the unpacked turns. Mini-batches are drawn over turns as without
    packing, then each packs its own turns, so every optimizer step sees the same turns; a micro-batch
    counts a packed row as its number of turns. Unlike rollout.merge_turns, nothing about the RL changes"""
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
    """linear LR warm-up over this many TRAINING steps (as verl counts them): an adapter's s-th training step
    trains at lr * min(1, s / warmup_steps), whatever the number of mini-batches and ppo_epochs in it; the steps
    counted are those that stepped the adapter (not those where it had no turns, was frozen, or had no signal)"""
    dynamic_sampling: bool = False
    """DAPO's filter: for roles whose estimator centres per group (grpo, rloo, reinforce++_baseline),
    groups (task, role) of several turns whose rewards all agree have zero advantage and leave the
    batch (their tokens leave every denominator); groups of one and other estimators' turns stay"""
    dynamic_sampling_max_rounds: int = 0
    """with dynamic_sampling: roll out up to this many extra batches of new tasks while fewer than
    data.batch_size tasks kept an informative group (DAPO's refill), then train on the informative
    groups of the first data.batch_size such tasks (DAPO's trim); 0 = filter only"""
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
    rollout_is: Literal["auto", "on", "off"] = "auto"
    """truncated importance sampling between the engine and the trainer (verl's TIS, TRL's vLLM IS
    correction): weight each token's policy loss by min(exp(old_logp - sampling_logp), rollout_is_cap)
    where old logprobs are recomputed. auto = on with the vLLM engine (bf16, its own LoRA kernels),
    off with TorchEngine (same network: the weight is ~1); on makes auto recompute the old logprobs (with
    never it is a config error). Logged: rollout_is_mean, rollout_is_capped_frac. With gspo the weight makes
    a row's advantages vary along it (GSPO assumes them constant per sequence)"""
    rollout_is_cap: float = 2.0
    """the cap C of the rollout IS weight (verl's TIS recipe uses 2)"""

    # the loss's settings with the defaults of the chosen loss filled in (None = that default)
    def rollout_is_on(self, engine: str) -> bool:
        return self.rollout_is == "on" or (self.rollout_is == "auto" and engine == "vllm")

    @property
    def clip(self) -> tuple[float, float]:
        lo, hi = (3e-4, 4e-4) if self.policy_loss == "gspo" else (0.2, 0.28)
        return (lo if self.clip_low is None else self.clip_low, hi if self.clip_high is None else self.clip_high)

    @property
    def agg(self) -> str:
        return self.loss_agg or ("seq-mean-token-mean" if self.policy_loss == "gspo" else "token-mean")

    @property
    def packs_turns(self) -> bool:
        """pack_turns, where packing leaves the loss exact (its docstring)."""
        return self.pack_turns and self.policy_loss == "ppo" and self.agg == "token-mean"



    def check(self):
        if self.micro_batch_tokens is not None:
            at_least("algo", [("micro_batch_tokens", self.micro_batch_tokens, 1)])
        at_least("algo", [("logits_chunk_tokens", self.logits_chunk_tokens, 0)])
        at_least("algo", [("mini_batch_size", self.mini_batch_size, 1), ("micro_batch_size", self.micro_batch_size, 1),
                           ("ppo_epochs", self.ppo_epochs, 1), ("dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds, 0),
                           ("warmup_steps", self.warmup_steps, 0)])
        for name, v in [("lr", self.lr), ("critic_lr", self.critic_lr)]:
            if v > MAX_LR:
                bad(f"algo.{name}", f"must be <= {MAX_LR}, got {v}")
        finite("algo", [("lr", self.lr), ("critic_lr", self.critic_lr), ("grad_clip", self.grad_clip)], positive=True)
        finite("algo", [("kl_coef", self.kl_coef), ("entropy_coef", self.entropy_coef), ("vf_coef", self.vf_coef),
                         ("weight_decay", self.weight_decay)], positive=False)
        for name, v in [("gamma", self.gamma), ("lam", self.lam)]:
            if not 0 <= v <= 1:
                bad(f"algo.{name}", f"must be in [0, 1], got {v}")
        lo, hi = self.clip
        if not (0 < lo < 1 and hi > 0):
            bad("algo.clip_low/clip_high", f"need 0 < clip_low < 1 and clip_high > 0, got {lo}, {hi}")
        if self.rollout_is == "on" and self.recompute_old_logprobs == "never":
            bad("algo.rollout_is", "weights the loss by exp(old - sampled logprobs), which is 1 when the old logprobs "
                 "ARE the sampled ones: set algo.recompute_old_logprobs to auto or always")
        if not (math.isfinite(self.rollout_is_cap) and self.rollout_is_cap >= 1):
            bad("algo.rollout_is_cap", f"must be a finite number >= 1, got {self.rollout_is_cap}")
        if self.dual_clip is not None and not (math.isfinite(self.dual_clip) and self.dual_clip > 1):
            bad("algo.dual_clip", f"must be a finite number > 1 (or None), got {self.dual_clip}")
        if self.vf_clip is not None and not (math.isfinite(self.vf_clip) and self.vf_clip > 0):
            bad("algo.vf_clip", f"must be a finite number > 0 (or None), got {self.vf_clip}")
        if not math.isfinite(self.kl_target) or (self.kl_adaptive and self.kl_target <= 0):
            bad("algo.kl_target", f"must be a finite number (> 0 for the adaptive controller), got {self.kl_target}")
        if self.kl_kind != "full" and self.kl_kind.rstrip("+") not in ("kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3"):
            bad("algo.kl_kind", f"unknown kind {self.kl_kind!r}: kl, abs, mse, low_var_kl (k1/k2/k3, optionally +) or full")
        if self.kl_adaptive and self.kl_horizon <= 0:
            bad("algo.kl_horizon", f"the adaptive KL controller needs it > 0, got {self.kl_horizon}")
        if self.kl_ref not in ("base", "init"):
            bad("algo.kl_ref", f"unknown reference {self.kl_ref!r}: base (adapters off) or init (each adapter's start)")
        if self.kl_ref == "init" and self.kl_coef == 0:
            bad("algo.kl_ref", "'init' sets the KL's reference, but algo.kl_coef is 0 (no KL): set algo.kl_coef > 0")
        if self.kl_adaptive and not (self.kl_in_reward and self.kl_coef > 0):
            bad("algo.kl_adaptive", "the adaptive controller moves the coefficient of the KL in the reward (as verl's "
                 "does): set algo.kl_in_reward and algo.kl_coef > 0 (its starting value); a KL in the loss keeps a "
                 "fixed kl_coef")

@dataclass
class RolloutConfig:
    engine: Literal["torch", "vllm"] = "torch"
    """torch = embedded TorchEngine (CPU/GPU); vllm = vLLM in process"""
    num_chains: int = 4
    """episodes per task (the group size of GRPO/RLOO)"""
    max_turns: int = 8
    """max model turns per episode"""
    top_p: float = 1.0
    """nucleus sampling in training rollouts. Both engines record a token's logprob under the truncated,
    renormalised distribution they sampled from, the trainer its logprob under the full one: their ratio is
    the kept mass, not a policy change (TRL #6789: 0.896 at top_p 0.8), so top_p < 1 (or top_k > 0) is refused
    where the engine's logprobs enter the loss (algo.rollout_is on, the default with vLLM, or
    algo.recompute_old_logprobs never); with the old logprobs recomputed, logprob_gap includes that mass"""
    top_k: int = 0
    """top-k sampling in training rollouts (0 = off; refused where top_p < 1 is)"""
    max_model_len: int = 2048
    """prompt + completion limit per turn; longer episodes end truncated"""
    max_batch_size: int = 64
    """TorchEngine rows per forward"""
    compile: bool = False
    """TorchEngine on CUDA: static-shape decode steps captured in CUDA graphs and replayed (gpt-fast
    style; docs/benchmarks.md "GPU path"). An error on CPU, where there is nothing to capture"""
    fuse: bool = False
    """with rollout.compile: the captured decode step is first compiled by torch.compile (inductor fuses the
    norms, RoPE, residual adds, activation, masking and sampling between the matmuls): 1.4-2.1x the graph's
    decode tok/s on an H200, for a compilation of ~40-85 s there per kind of batch when it first appears
    (batch 1, 2-63 or 64+ slots, routing on/off, top-k/top-p or not: at most 12); logprobs equal to rounding (within
    0.008 there, on rows whose tokens agree, measured with SDPA's attention; from 64 slots the fused step attends
    with matmuls, not measured there). docs/benchmarks.md "GPU path" """
    vllm_gpu_memory_utilization: float = 0.4
    """vLLM's share of GPU memory (the trainer needs the rest)"""
    vllm_sleep: bool = False
    """vLLM sleeps between the rollout and the update (sleep level 1: its KV cache discarded, its weights and
    adapters copied to host memory); the engine sync wakes the weights, the next rollout the KV cache. The
    update gets the memory back (at vllm_gpu_memory_utilization 0.4, ~50 GB of KV on an H200) and vLLM may
    take a larger share. Costs a host copy of the weights each way per step (vllm_engine.VLLMEngine). Not yet
    measured on a GPU here.
    On CPU vLLM has no sleep mode: the engine pauses and resumes and frees nothing (a warning says so)"""
    progress: bool = True
    """progress bars on rank 0 (stderr): rollout and eval episodes, the update over adapters"""
    merge_turns: bool = False
    """train a role's consecutive turns of one episode as one sequence when each prompt extends the
    last (tool agents); observations and other roles' tokens are masked out"""
    tree_sampling: bool = False
    """AT-GRPO's tree-style sampling (arXiv 2510.11062), training rollouts only: a task's num_chains chains
    share one state; at every turn (or set of turns handed out at once) each chain samples a candidate from
    the same prompt, the env pays it right after its step, every candidate trains in its (task, role, turn)
    group, and the best one's state goes on in every chain (rollout.run_episodes). Needs algo.group_by_turn,
    num_chains >= 2 and an env whose turn_rewards() holds after any step (`rewards_so_far = True`: the
    reason_code team, math_single, the toy); not with merge_turns, remax, roles.team_reward_weight or
    data.reward=calculator. Train metrics are then
    the chosen path's (best of num_chains at every node), not a chain's: compare val, which never uses it"""
    prefix_cache_tokens: int = 65536
    """TorchEngine (eager path): keep the KV of finished turns, at most this many tokens (LRU), so a turn
    whose prompt extends an earlier turn's prompt + reply under the same adapter prefills only the new
    tokens (ReAct steps, a role's next round); cleared at each engine sync. Costs 2 x layers x KV heads
    x head dim x dtype bytes per token (SmolLM2-135M fp32: 46 KB). 0 = off"""



    def check(self):
        at_least("rollout", [("num_chains", self.num_chains, 1), ("max_turns", self.max_turns, 1),
                              ("max_batch_size", self.max_batch_size, 1), ("max_model_len", self.max_model_len, 2),
                              ("prefix_cache_tokens", self.prefix_cache_tokens, 0)])
        if not 0 < self.top_p <= 1:
            bad("rollout.top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            bad("rollout.top_k", f"must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            bad("rollout.vllm_gpu_memory_utilization", f"must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        if self.vllm_sleep:
            import torch
            if self.engine != "vllm":
                bad("rollout.vllm_sleep", f"puts the vLLM engine to sleep: it needs rollout.engine=vllm, got {self.engine!r}")
            if not torch.cuda.is_available():
                import warnings
                warnings.warn("config field rollout.vllm_sleep: vLLM has no sleep mode on CPU; the engine pauses "
                              "and resumes around the update and frees no memory")
        if self.compile:
            import torch
            if self.engine != "torch" or not torch.cuda.is_available():
                bad("rollout.compile", "captures TorchEngine's decode step in CUDA graphs: it needs rollout.engine="
                     f"torch and a CUDA device (engine {self.engine!r}, CUDA available: {torch.cuda.is_available()})")
        if self.fuse and not self.compile:
            bad("rollout.fuse", "compiles the captured decode step: it needs rollout.compile")

@dataclass
class DataConfig:
    env: str = "math_3agent"
    """workflow: a built-in (workflows.BUILTINS: math_3agent, math_single, math_tool, code, search, react, research, swe,
    video_qa, debate, split_info, split_info_single, reason_code, toy: one speaker paid the share of its reply's
    non-space characters that are "7", what a random model can learn) or your own as `module:Class` or
    `path/to/file.py:Class` (README "Add a workflow": nothing else in troupe changes)"""
    env_kwargs: dict[str, int | float | bool | str | list] = field(default_factory=dict)
    """keyword arguments for the workflow's class: the settings only it uses, with their defaults in the
    env (math_3agent: evaluator_reward, refiner_reward, ...; react: style, tools, reward, corpus,
    search_k; search and research: corpus, search_k, ...) or your own `module:Class` env's. On the
    command line `--data.env-kwargs.KEY VALUE` for any KEY; an unknown one is a config error. An env that
    labels turns (math_3agent's evaluator_mixed_groups_only, on by default) leaves out every group whose
    labels all agree: a role can lose all its turns (a judge whose solutions were all wrong); the console
    then names the role and the reason (train/idle/<role>)"""
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



    def check(self):
        at_least("data", [("batch_size", self.batch_size, 1), ("max_refinement_iterations", self.max_refinement_iterations, 0)])
        if self.val_size is not None and self.val_size < 1:
            bad("data.val_size", f"must be >= 1 or None, got {self.val_size}")
        for name, path in [("data.train_files", self.train_files), ("data.val_files", self.val_files)]:
            path = path.partition("@")[0]  # QUESTIONS@CAPTIONS (video), TASKS@REPOS (swe): their loaders check the rest
            looks_local = path.endswith((".jsonl", ".json", ".parquet")) or path.startswith((".", "/"))
            if Path(path).is_dir():
                bad(name, f"{path} is a directory, not a data file")
            if looks_local and not Path(path).is_file():
                bad(name, f"{path} does not exist")

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
    strategy: Literal["fsdp2", "replicate"] = "fsdp2"
    """how a torchrun run spreads the model over its ranks (plain `python train.py` is one process either way).
    fsdp2: every decoder layer is sharded, so each forward and backward gathers its weights. replicate: every
    rank keeps the whole model (rank 0's adapters broadcast at the start), and only the trainable gradients are
    averaged: per optimizer step, one small all-reduce agreeing which exist and one of the gradients in a flat
    fp32 buffer (an adapter of rank 64 on q/k/v/o: ~70 MB at 1.5B, ~160 MB at 7B). For a frozen base that fits
    each GPU (bf16 1.5B: 3 GB; 7B: 15 GB), where fsdp2 gathers the frozen base in every forward and backward
    only to save memory the GPU has. Not yet measured on GPUs (bench/gpu_next.sh's torchrun_replicate_compile).
    A run may resume under the other strategy (GAE's critic then restarts its optimizer, with a note)"""
    threads: int = 0
    """torch CPU threads of this process. 0 = auto: OMP_NUM_THREADS when set, else the cores left free at
    start-up (cores minus the cores busy over a quarter second, session.busy_cores, at least 1). More threads
    than free cores made PyTorch's CPU runs 3-30x slower (docs/benchmarks.md "Threads"); a busy machine is
    named in one line at start"""
    trajectory_sample: float = 0.25
    """fraction of each step's training episodes written to runs/X/trajectories/ (every validation
    episode is written at each eval); 0 = none. The format: trajectories.py"""
    adapter_kl_turns: int = 16
    """val/adapter_kl/A~B (how far the adapters moved apart) is measured on the first N val turns of each eval:
    a forward per adapter per turn (over half of a tiny model's eval); 0 = not measured"""
    max_empty_steps: int = 3
    """stop with an error after this many steps in a row that train on nothing (every episode
    truncated, or no role produced a token): each such step is logged with its reason"""
    console: tuple[str, ...] = ()
    """more metric names the console line prints (a key of metrics.jsonl without its train/ or val/
    prefix, e.g. evaluator_recall); the workflow module's CONSOLE names print always"""
    logger: tuple[str, ...] = ("console",)
    """where metrics go besides metrics.jsonl (always written: resume and compare.py read it): console (a
    line per step and eval), wandb (set WANDB_MODE=offline without network), tensorboard (event files
    under <output_dir>/tensorboard: `tensorboard --logdir runs/`)"""
    wandb_project: str = "troupe"
    """wandb project name"""



    def check(self):
        at_least("trainer", [("total_steps", self.total_steps, 1), ("keep_checkpoints", self.keep_checkpoints, 1),
                              ("save_freq", self.save_freq, 0), ("test_freq", self.test_freq, 0),
                              ("max_empty_steps", self.max_empty_steps, 1), ("threads", self.threads, 0),
                              ("adapter_kl_turns", self.adapter_kl_turns, 0)])
        if not 0 <= self.seed <= MAX_SEED:
            bad("trainer.seed", f"must be in [0, {MAX_SEED}], got {self.seed}")
        if self.threads > MAX_THREADS:
            bad("trainer.threads", f"must be <= {MAX_THREADS} (0 = auto), got {self.threads}")
        if not 0 <= self.trajectory_sample <= 1:
            bad("trainer.trajectory_sample", f"must be in [0, 1], got {self.trajectory_sample}")
        if self.strategy not in ("fsdp2", "replicate"):
            bad("trainer.strategy", f"use fsdp2 or replicate, got {self.strategy!r}")
        if self.total_epochs is not None and self.total_epochs < 1:
            bad("trainer.total_epochs", f"must be >= 1 (or None: total_steps), got {self.total_epochs}")
        if self.logger and not set(self.logger) <= {"console", "wandb", "tensorboard"}:
            bad("trainer.logger", f"use any of console, wandb, tensorboard, got {self.logger}")
        out = Path(self.output_dir)
        for p in [out] + [out / x for x in ("tensorboard", "wandb") if x in self.logger]:
            if p.exists() and not p.is_dir():  # each is made a directory later: a file there is a traceback
                bad("trainer.output_dir", f"{p} exists and is not a directory")
        if self.resume not in ("auto", "none") and not (Path(self.resume) / "trainer_state.pt").is_file():
            bad("trainer.resume", f"{self.resume} is not a checkpoint directory (no trainer_state.pt); "
                 "use auto, none, or a runs/X/checkpoints/step_N directory")
        if self.eval_only and self.resume == "none":
            bad("trainer.eval_only", "needs a checkpoint: set trainer.resume to auto or a checkpoint path")

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

    def trains_at(self, role: RoleConfig, step: int) -> bool:
        """Whether `role`'s adapter is updated at training step `step`: after frozen_steps, inside its
        train_windows (if any)."""
        return step > role.frozen_steps and (role.train_windows is None
                                             or any(a <= step <= b for a, b in role.train_windows))

    def estimator_of(self, role: RoleConfig) -> str:
        return role.adv_estimator or self.algo.adv_estimator

    def lr_of(self, role: RoleConfig) -> float:
        return self.algo.lr if role.lr is None else role.lr

    def lora_of(self, role: RoleConfig) -> tuple[int, float, tuple[str, ...]]:
        """(rank, alpha, targets) of this role's adapter: its own settings, else lora.*"""
        return (self.lora.rank if role.rank is None else role.rank, self.lora.alpha if role.alpha is None else role.alpha,
                tuple(self.lora.targets if role.targets is None else role.targets))

    def role_of_adapter(self, adapter: str) -> RoleConfig:
        """The first role wearing `adapter` (roles sharing an adapter agree on its settings: validate)."""
        return next(r for r in self.roles if self.adapter_of(r) == adapter)

    @property
    def estimators(self) -> set[str]:
        """The advantage estimators the trainable roles use."""
        return {self.estimator_of(r) for r in self.roles if r.trainable}

    @property
    def adapters(self) -> list[str]:
        return sorted({self.adapter_of(r) for r in self.roles})

    @property
    def trainable_adapters(self) -> list[str]:
        return sorted({self.adapter_of(r) for r in self.roles if r.trainable})

    def validate(self) -> "Config":
        """Check every field before anything expensive happens; errors name the field: no NaN anywhere, each
        role's and each section's own fields (their `check`), then the rules across sections (config_rules)."""
        no_nan(self)
        check_roles(self)
        for section in (self.lora, self.algo, self.rollout, self.data, self.trainer):
            section.check()
        check_across(self)
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


def pop_env_kwargs(argv: list[str]) -> tuple[dict, list[str]]:
    """`--data.env-kwargs.KEY VALUE` (or =VALUE) out of a command line, for any KEY, listed in the config
    file or not -> ({key: value}, the other args). KEY's dashes become underscores; VALUE is read as JSON
    (3, 0.5, true, [\"a\", \"b\"]) or True/False/None, else kept as a string."""
    out, rest, i = {}, [], 0
    prefix = "--data.env-kwargs."
    while i < len(argv):
        x = argv[i]
        if not x.startswith(prefix):
            rest.append(x)
            i += 1
            continue
        key, eq, val = x[len(prefix):].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"config field data.env_kwargs.{key.replace('-', '_')}: {x} needs a value")
            val, i = argv[i + 1], i + 1
        i += 1
        low = {"true": True, "false": False, "none": None}
        try:
            v = low[val.lower()] if val.lower() in low else json.loads(val)
        except ValueError:
            v = val
        except RecursionError:
            raise ConfigError(f"config field data.env_kwargs.{key.replace('-', '_')}: the value is nested too deep") from None
        out[key.replace("-", "_")] = v
    return out, rest


def load_config_file(path: str) -> Config:
    """Execute a config file and return its `config` (a Config instance)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"config file {path} does not exist" + (" (it is a directory)" if Path(path).is_dir() else ""))
    spec = importlib.util.spec_from_file_location("troupe_config", path)
    if spec is None:
        raise FileNotFoundError(f"config file {path} is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = getattr(mod, "config", None)
    if not isinstance(cfg, Config):
        raise TypeError(f"{path} must define `config = Config(...)`, found {type(cfg).__name__}")
    return cfg


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def _tuples(x):
    """JSON's lists back to the tuples a config holds (targets, train_windows' pairs)."""
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def from_dict(d: dict) -> Config:
    """Inverse of to_dict: rebuild the Config a checkpoint's config.json was written from."""
    def build(cls, values):
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in values:
                continue  # a field added since: keep its default
            v = values[f.name]
            if f.name == "roles":  # fields a role no longer has (an older checkpoint's) are dropped
                known = {g.name for g in dataclasses.fields(RoleConfig)}
                v = tuple(RoleConfig(**{k: _tuples(x) for k, x in r.items() if k in known}) for r in v)
            elif dataclasses.is_dataclass(f.default_factory() if callable(f.default_factory) else None):
                v = build(type(f.default_factory()), v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)
    return build(Config, d)

"""The reasoner + coder team on the tiny random model (what tests run): each round both turns are handed out at
once (one engine call), the coder's ```python block runs in the sandbox, and a round where their answers differ
continues each role's own chat token for token (envs/reason_code.py), up to 2 rounds here. A random model
writes no code and no answer, so every episode takes both rounds; the mechanics are what is exercised.
Grouped per role and turn (AT-GRPO's agent-and-turn groups, algo.group_by_turn)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("reasoner", max_tokens=12), RoleConfig("coder", max_tokens=12)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=32, micro_batch_size=8, entropy_coef=0.01,
                    group_by_turn=True),
    rollout=RolloutConfig(num_chains=2, max_turns=4, max_model_len=768, progress=False),
    data=DataConfig(env="reason_code", train_files="data/multistep_train.jsonl", val_files="data/multistep_val.jsonl",
                    batch_size=2, val_size=4, env_kwargs={"max_rounds": 2}),
    trainer=TrainerConfig(total_steps=2, save_freq=0, test_freq=2, val_before_train=False, resume="none",
                          output_dir="runs/tiny_reason_code"),
)

"""Split information on the tiny random model (what tests run): two agents each see half of a task's facts,
are handed out at once in round 1 (one engine call for both), write each other a message, and in round 2 each
continues its own conversation (token for token) and answers (envs/split_info.py). A random model scores 0, so
the entropy bonus is what moves the adapters; the mechanics are what is exercised."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("agent_a", max_tokens=12), RoleConfig("agent_b", max_tokens=12)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=32, micro_batch_size=8, entropy_coef=0.01,
                    group_by_turn=True),
    rollout=RolloutConfig(num_chains=2, max_turns=4, max_model_len=768, progress=False),
    data=DataConfig(env="split_info", train_files="data/split_info_train.jsonl", val_files="data/split_info_val.jsonl",
                    batch_size=2, val_size=4),
    trainer=TrainerConfig(total_steps=2, save_freq=0, test_freq=2, val_before_train=False, resume="none",
                          output_dir="runs/tiny_split_info"),
)

"""A debate on the tiny random model (what tests run): two solvers answer independently, handed out at
once (one engine call for both), one debate round in which each reads the other and revises in its own
conversation (token for token), and a judge that picks one of the two (envs/debate.py). A random model
scores 0 on math, so the entropy bonus is what moves the adapters; the mechanics are what is exercised."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("solver", max_tokens=12), RoleConfig("judge", max_tokens=8)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=32, micro_batch_size=8, entropy_coef=0.01,
                    group_by_turn=True),
    rollout=RolloutConfig(num_chains=2, max_turns=5, max_model_len=768, progress=False),
    data=DataConfig(env="debate", batch_size=2, val_size=4, env_kwargs={"candidates": 2, "rounds": 2}),
    trainer=TrainerConfig(total_steps=2, save_freq=0, test_freq=2, val_before_train=False, resume="none",
                          output_dir="runs/tiny_debate"),
)

"""The deep-research team on the tiny random model: what tests run (CPU, seconds a step). A random
model finds nothing, so only the mechanics are exercised: every role's turns, merged researcher
rounds, per-role rewards and metrics. Fewer sub-questions and rounds than configs/research.py."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("planner", max_tokens=24), RoleConfig("researcher", max_tokens=12),
           RoleConfig("writer", max_tokens=12)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=32, micro_batch_size=8, entropy_coef=0.01),
    rollout=RolloutConfig(num_chains=2, max_turns=8, max_model_len=2048, merge_turns=True, progress=False),
    data=DataConfig(env="envs.research:ResearchEnv", train_files="data/research_train.jsonl",
                    val_files="data/research_val.jsonl", batch_size=2, val_size=2,
                    env_kwargs={"max_sub_questions": 2, "max_rounds": 2}),
    trainer=TrainerConfig(total_steps=2, save_freq=0, test_freq=2, val_before_train=False, resume="none",
                          output_dir="runs/tiny_research"),
)

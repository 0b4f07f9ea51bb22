"""The SWE team on the tiny random model: what tests run (CPU). Budgets cut to the bone so the
prompts stay short (the repository tools and the refinement loop are covered by the scripted
episodes in tests/test_swe.py): no tool calls, no refinement, one task of two chains per step.
A random model never writes a patch that applies; its rewards come from the validator (a
rejected or verdict-less reply on an unapplied patch) and an analyzer that happens to name the
file."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("analyzer", max_tokens=12), RoleConfig("writer", max_tokens=16), RoleConfig("validator", max_tokens=8)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=16, micro_batch_size=8, entropy_coef=0.01),
    rollout=RolloutConfig(num_chains=2, max_turns=4, max_model_len=2048, progress=False),
    data=DataConfig(env="envs.swe:SWETeamEnv", train_files="data/swe_train.jsonl", val_files="data/swe_val.jsonl",
                    batch_size=1, val_size=1,
                    env_kwargs={"max_refinement_iterations": 0, "max_analyzer_calls": 0, "max_validator_calls": 0,
                                "obs_chars": 400, "file_chars": 400, "test_timeout": 20.0}),
    trainer=TrainerConfig(total_steps=2, save_freq=0, test_freq=2, val_before_train=False,
                          output_dir="runs/tiny_swe"),
)

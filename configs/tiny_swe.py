"""The SWE team on the tiny random model: what tests run (CPU, seconds a step). A random model never
writes a patch that applies; its rewards come from the validator (an unapplied patch rightly
rejected) and from an analyzer that happens to name the file, which is enough to move GRPO."""
from config import (
    AlgoConfig,
    Config,
    DataConfig,
    LoRAConfig,
    ModelConfig,
    RoleConfig,
    RolloutConfig,
    TrainerConfig,
)

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("analyzer", max_tokens=12), RoleConfig("writer", max_tokens=16), RoleConfig("validator", max_tokens=8)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=16, micro_batch_size=8, entropy_coef=0.01),
    rollout=RolloutConfig(num_chains=2, max_turns=8, max_model_len=4096, progress=False),
    data=DataConfig(env="envs.swe:SWETeamEnv", train_files="data/swe_train.jsonl", val_files="data/swe_val.jsonl",
                    batch_size=2, val_size=2,
                    env_kwargs={"max_refinement_iterations": 1, "max_analyzer_calls": 1, "max_validator_calls": 1,
                                "obs_chars": 600, "file_chars": 1200, "test_timeout": 20.0}),
    trainer=TrainerConfig(total_steps=2, save_freq=0, test_freq=2, val_before_train=False,
                          output_dir="runs/tiny_swe"),
)

"""The single-agent baseline the team must beat: one solver, the same data and reward as the
CPU demo (configs/smollm2_math_cpu.py), one adapter."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("solver", max_tokens=48, temperature=0.5),),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, clip_high=0.28),
    rollout=RolloutConfig(num_chains=4, max_turns=1, max_model_len=1024),
    data=DataConfig(env="math_single", batch_size=4, val_size=40, levels=(1, 2)),
    trainer=TrainerConfig(total_steps=24, save_freq=6, test_freq=6, output_dir="runs/math_single"),
)

"""The single-agent baseline the team must beat: one solver on the CPU demo's data, reward, algorithm
and seeds (configs/smollm2_math_cpu.py), one adapter, 8 tasks a step: about the team's generated
tokens per step (the team spends ~2 turns a task; `train/gen_tokens` logs both)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("solver", max_tokens=48, temperature=0.5),),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, clip_high=0.28),
    rollout=RolloutConfig(num_chains=4, max_turns=1, max_model_len=1024, max_batch_size=128),
    data=DataConfig(env="math_single", train_files="data/arith12_train.jsonl", val_files="data/arith12_val.jsonl",
                    batch_size=8, val_size=None),
    trainer=TrainerConfig(total_steps=24, save_freq=12, test_freq=12, keep_checkpoints=3, output_dir="runs/math_single"),
)

"""The toy workflow on the tiny random model: one speaker, rewarded for the share of "7"s in its
reply (envs/toy.py). It starts near 0.085 and rises within a dozen CPU steps (a second or so each),
with any estimator:
    python train.py --config configs/tiny_toy.py --algo.adv-estimator rloo"""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("speaker", max_tokens=8),),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.05, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=5e-3, mini_batch_size=32, micro_batch_size=16, critic_lr=5e-3),
    rollout=RolloutConfig(num_chains=4, max_turns=1, max_model_len=128, progress=False),
    data=DataConfig(env="toy", train_files="toy", val_files="toy", batch_size=8, val_size=8),
    trainer=TrainerConfig(total_steps=30, save_freq=0, test_freq=0, val_before_train=False,
                          output_dir="runs/tiny_toy"),
)

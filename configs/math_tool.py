"""The math-tool team (analyzer -> executor + sandboxed Python -> verifier) on SmolLM2-135M, CPU."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("analyzer", max_tokens=64, temperature=0.7), RoleConfig("executor", max_tokens=96, temperature=0.7),
           RoleConfig("verifier", max_tokens=48, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8),
    rollout=RolloutConfig(num_chains=4, max_turns=6, max_model_len=1024),
    data=DataConfig(env="math_tool", batch_size=4, val_size=32, levels=(2, 3, 5), max_refinement_iterations=2),
    trainer=TrainerConfig(total_steps=20, save_freq=5, test_freq=5, output_dir="runs/math_tool"),
)

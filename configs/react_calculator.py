"""The classic tool-agent recipe: one ReAct agent with [calculator] on the math data. Its turns
extend one another, so the whole trajectory trains as one sequence (rollout.merge_turns) with the
tool observations masked out."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("agent", max_tokens=48, temperature=0.7),),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8),
    rollout=RolloutConfig(num_chains=4, max_turns=4, max_model_len=1024, merge_turns=True),
    data=DataConfig(env="react", env_kwargs={"style": "react", "tools": "calculator"}, batch_size=4, val_size=32,
                    levels=(2, 3, 5), max_refinement_iterations=3),
    trainer=TrainerConfig(total_steps=20, save_freq=5, test_freq=5, output_dir="runs/react_calculator"),
)

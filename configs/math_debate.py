"""A debate on GPUs: Qwen2.5-1.5B-Instruct, four solvers that answer GSM8K independently (one engine round for
all four), one debate round (each reads the others and revises in its own conversation), and a judge that
picks the team's answer (envs/debate.py). Solvers share one adapter, the judge has its own; AT-GRPO-style
groups per role and turn (algo.group_by_turn: solver k of round r is compared with solver k of round r).

    python data/prepare_hf.py gsm8k
    torchrun --nproc_per_node 8 train.py --config configs/math_debate.py
"""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="Qwen/Qwen2.5-1.5B-Instruct", dtype="bfloat16"),
    roles=(RoleConfig("solver", max_tokens=768), RoleConfig("judge", max_tokens=384)),
    lora=LoRAConfig(rank=64, alpha=16, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-5, mini_batch_size=256, micro_batch_size=8, kl_coef=0.001,
                    kl_kind="low_var_kl", group_by_turn=True),
    rollout=RolloutConfig(engine="vllm", num_chains=8, max_turns=9, max_model_len=6144, progress=True),
    data=DataConfig(env="debate", train_files="data/gsm8k_train.jsonl", val_files="data/gsm8k_test.jsonl",
                    batch_size=32, val_size=500, env_kwargs={"candidates": 4, "rounds": 2}),
    trainer=TrainerConfig(total_epochs=1, save_freq=50, test_freq=25, output_dir="runs/math_debate",
                          logger=("console", "wandb")),
)

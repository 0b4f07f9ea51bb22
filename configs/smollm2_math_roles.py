"""The 3-agent math team on SmolLM2-135M-Instruct with ONE ADAPTER PER ROLE: arm (c) of the README's
experiment ("Does the team beat one agent?"), and with the SFT'd evaluator and its per-role settings
arm (d):
    python train.py --config configs/smollm2_math_roles.py --roles.1.init-from runs/smollm2_sft/evaluator_critique \
        --roles.1.lr 5e-5 --roles.1.frozen-steps 8 --roles.1.adv-estimator reinforce++
The CPU demo (configs/smollm2_math_cpu.py) is the same team on one shared adapter, arm (b), which
beat this one (0.372 vs 0.338 on 500 val problems at step 24). Data, rewards, algorithm and seeds as
there: arithmetic of levels 1-2 (data/arith12_*), val = 500 problems, greedy, at steps 0, 12 and 24;
a judge paid +-1 against the truth and trained only on the groups whose judged solutions differ, a
refiner paid relative to the answer it was given."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("generator_initial", max_tokens=48, temperature=0.5),
           RoleConfig("evaluator_critique", max_tokens=32, temperature=0.7),
           RoleConfig("generator_refinement", max_tokens=48, temperature=0.5)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, clip_high=0.28),
    rollout=RolloutConfig(num_chains=4, max_turns=4, max_model_len=1024, max_batch_size=128),
    data=DataConfig(env="math_3agent", train_files="data/arith12_train.jsonl", val_files="data/arith12_val.jsonl",
                    batch_size=4, val_size=None, max_refinement_iterations=1),
    trainer=TrainerConfig(total_steps=24, save_freq=12, test_freq=12, keep_checkpoints=3,
                          output_dir="runs/smollm2_math_roles"),
)

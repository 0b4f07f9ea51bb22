"""CPU recipe (recipes.py split_info): the split-information team (envs/split_info.py: two agents, each seeing half
of a task's facts, exchange one message each and answer; the team's answer is agent_a's) on SmolLM2-135M, on
data/split_info_*.jsonl (600 train, 200 val; the 200 test tasks are kept for the pre-registered comparison). SFT
on the scripted team's turns (each agent passes on its needed fact, then both write the two facts, the step and
the answer) for 32 training tasks, at least 32 optimizer steps a role, then 24 GRPO steps of 4 tasks x 4 chains
grouped by agent and turn (algo.group_by_turn: a round-1 message is centred among the other chains' round-1
messages of the same agent, an answer among answers); val: all 200 val tasks, greedy, at step 0 (the SFT start)
and 24; the base model on the first 40 (BASE_TASKS).
Its matched baseline is configs/cpu/split_info_single.py (one agent, every fact, the same data, teacher tasks,
SFT schedule and generated-token cap). Not run yet: the steps, SFT size and token caps are starting points
chosen like math_tool's, for the session that pre-registers and runs the comparison."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

MAX_TOKENS = 64
"""per agent turn: the teacher's message is ~10-20 tokens, its answer (two facts, the step, the answer) ~30-40"""
config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("agent_a", max_tokens=MAX_TOKENS, temperature=0.7),
           RoleConfig("agent_b", max_tokens=MAX_TOKENS, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, group_by_turn=True),
    rollout=RolloutConfig(num_chains=4, max_turns=4, max_model_len=1024),
    data=DataConfig(env="split_info", train_files="data/split_info_train.jsonl", val_files="data/split_info_val.jsonl",
                    batch_size=4, val_size=200, env_kwargs={"max_rounds": 2}),
    trainer=TrainerConfig(total_steps=24, save_freq=4, test_freq=24, val_before_train=True,
                          output_dir="runs/recipes/split_info/rl"),
)
BASE_TASKS = 40
SFT = {"teacher_tasks": 32, "lr": 2e-4, "epochs": 2, "min_steps": 32, "micro_batch_size": 4, "grad_accum": 2}
BASELINE = "split_info_single"
"""recipes.py split_info --baselines: this team against that recipe's one agent and its majority vote"""
TEST_FILES = "data/split_info_test.jsonl"

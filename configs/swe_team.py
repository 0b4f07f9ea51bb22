"""The SWE team (analyzer -> writer -> validator, envs/swe.py) on SmolLM2-135M-Instruct, CPU, on the
offline SWE-bench-format instances in data/swe_{train,val}.jsonl (`python -m data.swe_generate`
regenerates them from HumanEval). A 135M model almost never writes an edit block that applies, so
on CPU this config shows the workflow's mechanics and step time rather than learning; real runs
want a 1.5B-7B coder model on a GPU (--model.spec Qwen/Qwen2.5-Coder-7B-Instruct --rollout.engine
vllm, longer budgets; docs/swe.md). Budgets are cut to fit 2 CPU cores: two analyzer tool
calls, one validator tool call, one refinement, tool output and file views capped. Measured (one step,
--data.batch-size 1 --rollout.num-chains 2, one thread beside one other job, median of 3, 2026-11-26):
115 s (rollout 58 + train 58), every reward 0: no tool call, no edit block, no verdict."""
from config import (
    AlgoConfig,
    Config,
    DataConfig,
    LoRAConfig,
    ModelConfig,
    RoleConfig,
    RolloutConfig,
    TrainerConfig,
)

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("analyzer", max_tokens=64, temperature=0.7), RoleConfig("writer", max_tokens=160, temperature=0.7),
           RoleConfig("validator", max_tokens=48, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=4),
    rollout=RolloutConfig(num_chains=4, max_turns=10, max_model_len=3072),
    data=DataConfig(env="envs.swe:SWETeamEnv", train_files="data/swe_train.jsonl", val_files="data/swe_val.jsonl",
                    batch_size=2, val_size=16,
                    env_kwargs={"max_refinement_iterations": 1, "max_analyzer_calls": 2, "max_validator_calls": 1,
                                "obs_chars": 1200, "file_chars": 2500, "test_timeout": 30.0, "disk_mb": 16}),
    trainer=TrainerConfig(total_steps=20, save_freq=5, test_freq=5, output_dir="runs/swe_team"),
)

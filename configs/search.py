"""The search team (query writer -> BM25 search -> answerer, with refinement cycles) on the offline
multi-hop set in data/search_{corpus,train,val}.jsonl (python data/search_data.py regenerates it)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("query_writer", max_tokens=24, temperature=0.7), RoleConfig("answerer", max_tokens=32, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8),
    rollout=RolloutConfig(num_chains=4, max_turns=6, max_model_len=1024),
    data=DataConfig(env="search", train_files="data/search_train.jsonl", val_files="data/search_val.jsonl",
                    batch_size=4, val_size=30, max_refinement_iterations=3),  # cycles: a 2-hop question takes 3 searches
    trainer=TrainerConfig(total_steps=20, save_freq=5, test_freq=5, output_dir="runs/search"),
)

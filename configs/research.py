"""The deep-research team on SmolLM2-135M, CPU: planner -> one researcher per sub-question (search /
read_doc / note over the made-up world's 160 documents, 3 actions each) -> writer (answer + [doc id]
citations), on the offline 3-/4-hop questions of data/research_{train,val}.jsonl
(python data/research_data.py regenerates them). Two files, nothing else edited: envs/research.py and
this. The researcher's rounds of one sub-question extend one conversation, so they train as one
sequence (rollout.merge_turns). A HotpotQA-format file works too: --data.train-files my_hotpot.jsonl
(each question then searches its own context paragraphs)."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("planner", max_tokens=64, temperature=0.7),
           RoleConfig("researcher", max_tokens=32, temperature=0.7),
           RoleConfig("writer", max_tokens=40, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8),
    # 1 planner turn + up to 4 sub-questions x 3 researcher rounds + 1 writer turn = 14 turns
    rollout=RolloutConfig(num_chains=4, max_turns=14, max_model_len=1536, merge_turns=True),
    data=DataConfig(env="envs.research:ResearchEnv", train_files="data/research_train.jsonl",
                    val_files="data/research_val.jsonl", batch_size=4, val_size=20,
                    env_kwargs={"corpus": "data/search_corpus.jsonl", "search_k": 3, "max_sub_questions": 4,
                                "max_rounds": 3, "citation_weight": 0.5, "note_weight": 1 / 3,
                                "planner_gate": True, "round_credit": False}),
    trainer=TrainerConfig(total_steps=20, save_freq=5, test_freq=5, output_dir="runs/research"),
)

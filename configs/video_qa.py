"""The video-QA team on SmolLM2-135M, CPU: captioner (cites the clips that matter) and grapher (scene-graph
triples with clip ids), each ending with its choice, then the organizer (answers one of five choices from
their two reports) on the synthetic caption "videos" of data/video_{train,val}.jsonl (python
data/video_data.py regenerates them; 390 train / 102 val questions). Two files, nothing else edited:
envs/video_qa.py and this. Real caption files: --data.train-files QUESTIONS@CAPTIONS[@ANSWERS] (NExT-QA
or EgoSchema questions, "video id -> captions" JSON; docs/video-qa.md). The agreement skip is off
so that every episode trains the organizer (--data.env-kwargs.skip-on-agreement True turns it on).
Measured (3 steps at --data.batch-size 2 --rollout.num-chains 2, one torch thread, 2 cores shared with other
jobs at load 3-5): 119-151 s a step (rollout 40-54 s + update 73-102 s); every role's reward at chance level
(docs/video-qa.md). A GPU run wants a 1.5B-7B model, longer budgets and 16-32 tasks x 8 chains."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="smollm2-135m-instruct"),
    roles=(RoleConfig("captioner", max_tokens=64, temperature=0.7),
           RoleConfig("grapher", max_tokens=64, temperature=0.7),
           RoleConfig("organizer", max_tokens=24, temperature=0.7)),
    lora=LoRAConfig(rank=16, alpha=32, dropout=0.0),
    algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8),
    # captioner, grapher, organizer: three turns (two when the agreement skip ends the episode)
    rollout=RolloutConfig(num_chains=4, max_turns=3, max_model_len=1536),
    data=DataConfig(env="envs.video_qa:VideoQAEnv", train_files="data/video_train.jsonl",
                    val_files="data/video_val.jsonl", batch_size=4, val_size=40,
                    env_kwargs={"skip_on_agreement": False, "max_caption_chars": 6000, "max_report_chars": 1200}),
    trainer=TrainerConfig(total_steps=20, save_freq=5, test_freq=5, output_dir="runs/video_qa"),
)

"""The video-QA team on the tiny random model: what tests run (CPU, seconds a step). A random model
practically never cites a clip or names a choice, so only the mechanics are exercised: every role's
turns, per-role rewards, the workflow's metrics (accuracy by question type, agreement and skip rates,
tokens per role), checkpoints that eval.py and compare.py read. One task of two chains per step and
short budgets keep it fast, and the captions are cut to ~300 characters (a few clips): the tiny model's
byte-level tokenizer makes the full prompts ~1100 tokens."""
from config import AlgoConfig, Config, DataConfig, LoRAConfig, ModelConfig, RoleConfig, RolloutConfig, TrainerConfig

config = Config(
    model=ModelConfig(spec="tiny"),
    roles=(RoleConfig("captioner", max_tokens=12), RoleConfig("grapher", max_tokens=12),
           RoleConfig("organizer", max_tokens=8)),
    lora=LoRAConfig(rank=8, alpha=16, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    algo=AlgoConfig(adv_estimator="grpo", lr=1e-3, mini_batch_size=32, micro_batch_size=8, entropy_coef=0.01),
    rollout=RolloutConfig(num_chains=2, max_turns=3, max_model_len=2048, progress=False),
    data=DataConfig(env="envs.video_qa:VideoQAEnv", train_files="data/video_train.jsonl",
                    val_files="data/video_val.jsonl", batch_size=1, val_size=2,
                    env_kwargs={"max_caption_chars": 300}),
    trainer=TrainerConfig(total_steps=2, save_freq=0, test_freq=2, val_before_train=False, resume="none",
                          output_dir="runs/tiny_video_qa"),
)

"""troupe's entry point: config -> init -> loop (rollout, score, advantages, per-role update, sync,
log, checkpoint, eval). Not built yet: the RL loop arrives with issue #6."""
raise NotImplementedError("train.py is not built yet: the RL loop arrives with issue #6 "
                          "(see README). lora.py and model.py work today.")

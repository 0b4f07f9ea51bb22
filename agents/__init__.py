"""Role prompts and reply parsing, one file per role set."""

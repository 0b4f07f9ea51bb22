"""Role prompts and reply parsing, one file per role set. Arrives with issue #5."""

"""What runs the code and the tools agents call, below the workflows: `sandbox.py` runs model-written Python under
bubblewrap (imports nothing of troupe), `tools.py` holds the tools themselves and reads tool calls from replies.
No config and no data loaders here: the workflows (envs/), rewards and agents import these, never the other way
round (tests/test_layers.py)."""

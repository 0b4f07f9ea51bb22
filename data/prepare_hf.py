"""Write GSM8K / MATH-500 / DeepMath-103K as troupe JSONL ({"question", "answer"}) for users with
network access (not run in tests; needs `pip install datasets`).

    python data/prepare_hf.py gsm8k          # -> data/gsm8k_{train,test}.jsonl
    python data/prepare_hf.py math500        # -> data/math500_test.jsonl
    python data/prepare_hf.py deepmath       # -> data/deepmath_train.jsonl
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.math_data import _row_to_task  # noqa: E402

SOURCES = {
    "gsm8k": [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")],
    "math500": [("HuggingFaceH4/MATH-500", None, "test")],
    "deepmath": [("zwhe99/DeepMath-103K", None, "train")],
}


def main(name):
    import datasets
    for repo, cfg, split in SOURCES[name]:
        ds = datasets.load_dataset(repo, cfg, split=split)
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}_{split}.jsonl")
        with open(out, "w") as f:
            for i, row in enumerate(ds):
                f.write(json.dumps(_row_to_task(dict(row), f"{repo}[{split}] row {i}")) + "\n")
        print(f"wrote {out} ({len(ds)} rows)")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in SOURCES:
        sys.exit(f"usage: python data/prepare_hf.py {{{','.join(SOURCES)}}}")
    main(sys.argv[1])

"""A model directory with random weights of a real model's shape, for checking the GPU path offline.

    python bench/random_model.py qwen2.5-1.5b --tokenizer ~/.cache/troupe/<a converted model> --out /tmp/q15
    torchrun --nproc_per_node 1 train.py --config configs/math_3agent.py --model.spec /tmp/q15 ...

Writes config.json (the shapes of bench/gpu.py's CONFIGS, from the models' config.json on the hub) and
model.safetensors (random init, --dtype) beside the tokenizer of --tokenizer (any local
model directory: the text the model reads only has to fit its vocabulary; transformers then reads it
through Qwen2's tokenizer class, config.json's model_type). Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import COMMON, CONFIGS  # noqa: E402


def write(shape: str, tokenizer: Path, out: Path, dtype="bfloat16", device="cpu", seed=0) -> Path:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    tok = AutoTokenizer.from_pretrained(tokenizer)
    torch.manual_seed(seed)
    shapes = {**CONFIGS[shape], "vocab_size": max(CONFIGS[shape]["vocab_size"], -(-len(tok) // 64) * 64)}  # `smoke` grows
    cfg = Qwen2Config(**COMMON, **shapes, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    with torch.device(device):
        m = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(out)
    tok.save_pretrained(out)  # its own files, chat template included
    n = sum(p.numel() for p in m.parameters())
    print(f"{out}: random {shape} ({n / 1e6:.0f}M params, {dtype}), tokenizer of {tokenizer} ({len(tok)} tokens)")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(CONFIGS))
    ap.add_argument("--tokenizer", type=Path, required=True, help="a local model directory with tokenizer files")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where to init")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write(a.shape, a.tokenizer, a.out, a.dtype, a.device, a.seed)


if __name__ == "__main__":
    main()

"""Export a checkpoint's adapters as ordinary Hugging Face models: one merged directory per adapter.

    python export.py --checkpoint runs/X/checkpoints/step_000024 --out exported/
    python export.py --checkpoint ... --out exported/ --adapter generator_initial

Each `<out>/<adapter>/` holds the base weights with that adapter merged in, the config and the
tokenizer (chat template included): `AutoModelForCausalLM.from_pretrained(dir)` and vLLM load it
with no troupe code. The PEFT adapters themselves are in the checkpoint's `adapters/<name>/`
(`peft.PeftModel.from_pretrained(base, dir)` loads them). Nothing is merged in place.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import lora
from config import from_dict
from model import load_model


def export(checkpoint, out, adapters=None) -> list[Path]:
    checkpoint, out = Path(checkpoint), Path(out)
    cfg = from_dict(json.loads((checkpoint / "config.json").read_text()))
    model, tok = load_model(cfg.model.spec, cfg.model.dtype, "cpu", seed=cfg.trainer.seed)
    names = adapters or sorted(p.name for p in (checkpoint / "adapters").iterdir() if p.is_dir())
    for name in names:
        lora.load_adapter(model, name, checkpoint / "adapters" / name)
    written = []
    for name in names:
        d = out / name
        model.save_pretrained(d, state_dict=lora.merged_state_dict(model, name), safe_serialization=True)
        tok.save_pretrained(d)
        written.append(d)
        print(f"{name}: {d}")
    return written


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="runs/X/checkpoints/step_N")
    p.add_argument("--out", required=True, help="output directory (one subdirectory per adapter)")
    p.add_argument("--adapter", action="append", help="only this adapter (repeatable); default: all")
    a = p.parse_args()
    export(a.checkpoint, a.out, a.adapter)

"""Export a checkpoint's adapters as ordinary Hugging Face models: one merged directory per adapter.

    python export.py --checkpoint runs/X/checkpoints/step_000024 --out exported/
    python export.py --checkpoint ... --out exported/ --adapter generator_initial

An --out that is a file, under one, or inside a checkpoint's own files, and an --adapter the checkpoint does
not have, are one line before anything loads. Each `<out>/<adapter>/` holds the base weights with that adapter merged in, the config and the
tokenizer (chat template included): `AutoModelForCausalLM.from_pretrained(dir)` and vLLM load it
with no troupe code. The PEFT adapters themselves are in the checkpoint's `adapters/<name>/`
(`peft.PeftModel.from_pretrained(base, dir)` loads them). Nothing is merged in place.

    python export.py --checkpoint ... --out exported/ --push-to-hub you/math-team

also uploads each PEFT adapter (with a model card naming its base) to the hub repo
`you/math-team-<adapter>` (needs network and `huggingface-cli login` or HF_TOKEN). The local export
is written first, so a failed upload loses nothing.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: docs/benchmarks.md "Threads"

import argparse
import json
import shutil
from pathlib import Path

import lora
from model import load_model
from rundir import check_out, checkpoint_config


def hub_folder(checkpoint, name: str, out) -> Path:
    """What --push-to-hub uploads for one adapter: the checkpoint's PEFT files and a model card."""
    checkpoint = Path(checkpoint)
    src, d = checkpoint / "adapters" / name, Path(out) / "hub" / name
    d.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, d / f.name)
    base = json.loads((src / "adapter_config.json").read_text()).get("base_model_name_or_path")
    (d / "README.md").write_text(
        f"---\nlibrary_name: peft\nbase_model: {base}\ntags: [troupe, lora, reinforcement-learning]\n---\n"
        f"# {name}\n\nThe `{name}` LoRA adapter of a troupe team, from `{checkpoint}` (step "
        f"{checkpoint.name.removeprefix('step_').lstrip('0') or 0}).\n\n```python\nfrom peft import "
        f"AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained(\"<this repo>\")\n```\n")
    return d


def push_to_hub(checkpoint, out, prefix: str, adapters=None) -> list[str]:
    """Upload each adapter to `<prefix>-<adapter>`; a clear error (nothing lost) when the hub is unreachable."""
    from huggingface_hub import HfApi
    checkpoint = Path(checkpoint)
    names = adapters or sorted(p.name for p in (checkpoint / "adapters").iterdir() if p.is_dir())
    api, urls = HfApi(), []
    for name in names:
        repo = f"{prefix}-{name}"
        folder = hub_folder(checkpoint, name, out)
        try:
            api.create_repo(repo, exist_ok=True)
            urls.append(str(api.upload_folder(repo_id=repo, folder_path=folder, commit_message=f"troupe: {name}")))
        except Exception as e:  # noqa: BLE001 — network, auth, permissions: say which repo and why
            raise SystemExit(f"error: could not push adapter {name!r} to the hub repo {repo!r} ({type(e).__name__}: "
                             f"{str(e)[:300]}); the files are ready in {folder}") from None
        print(f"{name}: {urls[-1]}")
    return urls


def export(checkpoint, out, adapters=None) -> list[Path]:
    checkpoint, out = Path(checkpoint), Path(out)
    check_out(out)  # not a file, nor under one, nor inside a checkpoint's own files: one line
    cfg = checkpoint_config(checkpoint)  # checked as resume checks it (a NaN adapter is refused); one line if bad
    have = sorted(p.name for p in (checkpoint / "adapters").iterdir() if p.is_dir())
    if unknown := [a for a in adapters or () if a not in have]:  # '../x' would read and write outside
        raise SystemExit(f"error: --adapter {unknown[0][:80]!r}: {checkpoint} has no such adapter (it has {have})")
    model, tok = load_model(cfg.model.spec, cfg.model.dtype, "cpu", seed=cfg.trainer.seed)
    names = adapters or have
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
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="runs/X/checkpoints/step_N")
    p.add_argument("--out", required=True, help="output directory (one subdirectory per adapter)")
    p.add_argument("--adapter", action="append", help="only this adapter (repeatable); default: all")
    p.add_argument("--push-to-hub", metavar="PREFIX", help="also upload each adapter to the hub repo PREFIX-<adapter>")
    a = p.parse_args()
    export(a.checkpoint, a.out, a.adapter)
    if a.push_to_hub:
        push_to_hub(a.checkpoint, a.out, a.push_to_hub, a.adapter)

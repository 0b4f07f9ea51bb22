"""Prompts for single agents that use tools, in three styles:
    chat   answer directly (no tools)
    react  Thought / Action / Observation (tool calls as `Action: tool[input]` or <tool_call>)
    code   code-acting: the reply's ```python block is run and its output shown back
and for three kinds of task, by the reward that scores them (envs/react.py REWARDS):
    math, qa_f1, qa_em   end with the final answer in \\boxed{} (or the `answer` tool)
    code                 write the function the task asks for; the last one written is graded
`read_final(reply)` reads a final answer from a reply; it never raises."""
from __future__ import annotations

import re

from runtime.tools import Tool, tool_prompt
from rewards.math import extract_answer

STYLE = {
    "chat": "Solve the problem and end with the final answer in \\boxed{}.",
    "react": "Solve the problem step by step. Each reply is either\nThought: <reasoning>\nAction: <tool>[<input>]\n"
             "(then wait for the Observation), or the final answer in \\boxed{}. Example: Action: {example}",
    "code": "Solve the problem by writing Python. Put code in a ```python block that prints what you need; you will "
            "see its output. When you know the answer, reply with it in \\boxed{} and no code.",
}
# a code task (reward "code"): the answer IS the function, so the styles end differently
CODE_STYLE = {
    "chat": "Write the Python function the task asks for, complete, in one ```python block.",
    "react": "Write the Python function the task asks for. Each reply is either\nThought: <reasoning>\n"
             "Action: <tool>[<input>]\n(then wait for the Observation), or your finished function in a ```python "
             "block and no Action. Example: Action: {example}",
    "code": "Write the Python function the task asks for, in a ```python block: it runs in a sandbox and you see what "
            "it prints (call your function on an example and print the result). When it works, reply DONE with no "
            "code: the last function you wrote is graded by hidden tests.",
}
EXAMPLE = {"calculator": "calculator[3 * 7]", "search": "search[capital of Garhullo]",
           "python": "python[print(3 * 7)]", "answer": "answer[42]"}


def system_prompt(style: str, tools: list[Tool], reward: str = "math") -> str:
    table = CODE_STYLE if reward == "code" else STYLE
    if style not in table:
        raise ValueError(f"unknown agent style {style!r}; use chat, react or code")
    example = next((EXAMPLE[t.name] for t in tools if t.name in EXAMPLE and t.name != "answer"), EXAMPLE["calculator"])
    text = table[style].replace("{example}", example)
    return text + ("\n\n" + tool_prompt(tools) if style == "react" and tools else "")


def observation_message(text: str) -> dict:
    """Tool output goes back as a user message (every chat template has that role)."""
    return {"role": "user", "content": f"Observation:\n{text}"}


_ANSWER_LINE = re.compile(r"answer\s*+:\s*+([^\n]*)", re.IGNORECASE)


def read_final(reply) -> str | None:
    """The final answer of a reply: \\boxed{}, `#### x` or "the answer is x" (rewards.math), else the
    text after the last non-empty 'Answer:'; None when there is none. Never raises, linear time."""
    if not isinstance(reply, str):
        return None
    a = extract_answer(reply)
    if a is not None:
        return a
    last = None
    for m in _ANSWER_LINE.finditer(reply):
        if m.group(1).strip():
            last = m.group(1)
    return last.strip().strip(".").strip() or None if last is not None else None

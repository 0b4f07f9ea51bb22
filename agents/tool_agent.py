"""Prompts for single agents that use tools, in three styles:
    chat   answer directly (no tools)
    react  Thought / Action / Observation (tool calls as `Action: tool[input]` or <tool_call>)
    code   code-acting: the reply's ```python block is run and its output shown back
Every style ends with a final answer in \\boxed{} (or the `answer` tool)."""
from __future__ import annotations

from envs.tools import Tool, tool_prompt

STYLE = {
    "chat": "Solve the problem and end with the final answer in \\boxed{}.",
    "react": "Solve the problem step by step. Each reply is either\nThought: <reasoning>\nAction: <tool>[<input>]\n"
             "(then wait for the Observation), or the final answer in \\boxed{}. Example: Action: calculator[3 * 7]",
    "code": "Solve the problem by writing Python. Put code in a ```python block that prints what you need; you will "
            "see its output. When you know the answer, reply with it in \\boxed{} and no code.",
}


def system_prompt(style: str, tools: list[Tool]) -> str:
    if style not in STYLE:
        raise ValueError(f"unknown agent style {style!r}; use chat, react or code")
    return STYLE[style] + ("\n\n" + tool_prompt(tools) if style == "react" and tools else "")


def observation_message(text: str) -> dict:
    """Tool output goes back as a user message (every chat template has that role)."""
    return {"role": "user", "content": f"Observation:\n{text}"}

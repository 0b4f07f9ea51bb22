"""A single agent with tools over several turns (chat, ReAct or code-acting; agents/tool_agent.py).

    reset(task) -> Turn("agent", [system, user question])
    step(reply): a final answer (\\boxed{} or the answer tool) ends the episode; a tool call (ReAct)
                 or a ```python block (code style) runs and its output comes back as an
                 Observation; a malformed call comes back as an error observation; a reply with
                 neither ends the episode (its text is read for an answer).
Reward: every turn of the episode gets the final answer's math_reward (outcome reward). The
episode's messages grow turn by turn (reply, then observation), so rollout.merge_turns can
train the whole trajectory as one sequence with the observations masked out.
"""
from __future__ import annotations

from agents.tool_agent import observation_message, system_prompt
from envs.tools import ANSWER, CALCULATOR, PYTHON, ToolCall, call_tool, parse_tool_call
from rewards.code import extract_code
from rewards.math import extract_answer, math_reward
from envs import Turn

ROLES = ("agent",)
TOOLS = {"calculator": CALCULATOR, "python": PYTHON, "answer": ANSWER}


class ToolAgentEnv:
    roles = ROLES

    def __init__(self, style: str = "react", tools=("calculator",), max_tool_calls: int = 4):
        self.style, self.max_calls = style, max_tool_calls
        self.tools = [TOOLS[t] for t in tools] + ([ANSWER] if style == "react" else [])

    def reset(self, task):
        self.answer, self.final, self.calls, self.errors, self.turns = str(task["answer"]), None, 0, 0, 0
        self.messages = [{"role": "system", "content": system_prompt(self.style, self.tools)},
                         {"role": "user", "content": task["question"]}]
        return Turn("agent", list(self.messages))

    def step(self, reply: str):
        self.turns += 1
        self.messages.append({"role": "assistant", "content": reply})
        obs = None
        if self.style == "react":
            call = parse_tool_call(reply, self.tools)
            if isinstance(call, ToolCall) and call.name == "answer":
                self.final = call.arguments["answer"]
            elif isinstance(call, ToolCall):
                obs = call_tool(call, self.tools)
            elif isinstance(call, str):
                obs, self.errors = call, self.errors + 1
        elif self.style == "code" and "```" in reply and extract_answer(reply) is None:
            obs = call_tool(ToolCall("python", {"code": extract_code(reply)}), [PYTHON])
        if obs is None or self.calls >= self.max_calls:
            if self.final is None:
                self.final = extract_answer(reply)
            return None
        self.calls += 1
        self.messages.append(observation_message(obs))
        return Turn("agent", list(self.messages))

    def turn_rewards(self):
        r = math_reward(f"\\boxed{{{self.final}}}", self.answer) if self.final is not None else 0.0
        return [r] * self.turns

    def metrics(self):
        ok = float(self.turn_rewards()[-1]) if self.turns else 0.0
        return {"final_correct": ok, "team_reward": ok, "tool_calls": self.calls, "tool_errors": self.errors,
                "no_answer": float(self.final is None)}


def aggregate(episodes) -> dict:
    ms = [e.metrics for e in episodes if e.metrics]
    n = max(1, len(ms))
    steps = [s for e in episodes for s in e.steps]
    return {"final_acc": sum(m["final_correct"] for m in ms) / n, "tool_calls": sum(m["tool_calls"] for m in ms) / n,
            "tool_errors": sum(m["tool_errors"] for m in ms) / n, "no_answer": sum(m["no_answer"] for m in ms) / n,
            "tokens/agent": sum(len(s.completion_ids) for s in steps) / max(1, len(steps))}

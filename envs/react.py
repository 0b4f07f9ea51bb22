"""A single agent with tools over several turns (chat, ReAct or code-acting; agents/tool_agent.py),
its tools and its reward picked by name.

    reset(task) -> Prompt("agent", [system, user question])
    step(reply): a final answer (\\boxed{}, 'Answer:' or the answer tool) ends the episode; a tool call
                 (ReAct) or a ```python block (code style) runs and its output comes back as an
                 Observation; a malformed call comes back as an error observation; a reply with
                 neither ends the episode (its text is read for an answer).

Tools by name (envs/tools.get_tools): calculator, python, search (BM25 over `corpus`), answer.
Rewards by name (REWARDS below), each (final answer or code, task) -> [0, 1]:
    math    math_reward of the final answer against task["answer"] (the default)
    qa_f1   SQuAD F1 of the final answer against task["answer"];  qa_em: exact match
    code    fraction of task["tests"] passed by the agent's LAST function: the last code it ran
            (python tool / code block) or answered with that defines task["entry_point"] (a body
            alone goes under task["prompt"]), run in the sandbox by rewards.code.run_tests
Every turn of the episode gets that outcome reward. The episode's messages grow turn by turn
(reply, then observation), so rollout.merge_turns can train the whole trajectory as one sequence
with the observations masked out.

Configs: `data.env="react"` (or "envs.react:ToolAgentEnv") with its settings in data.env_kwargs
(style, tools, reward, corpus, search_k, max_tool_calls; defaults here), e.g. ReAct + search + QA F1:
    --data.env react --data.env-kwargs.tools search --data.env-kwargs.reward qa_f1
`load_tasks(spec)` reads code tasks (humaneval, or rows with entry_point/tests) and everything else
with the math loader (question/answer rows: math, the search set).
"""
from __future__ import annotations

import re

from agents.tool_agent import observation_message, read_final, system_prompt
from envs import Prompt, need_file, need_int
from data.search_data import search_tool
from envs.tools import ANSWER, PYTHON, ToolCall, call_tool, get_tools, parse_tool_call, tool_names
from rewards.code import extract_code, run_tests
from rewards.math import math_reward
from rewards.qa import exact_match, f1

ROLES = ("agent",)


def _code_reward(code, task) -> float:
    return run_tests(code, task).reward if code else 0.0


# name -> (final answer or code, task) -> reward in [0, 1]; the task fields each one needs
REWARDS = {
    "math": lambda final, task: math_reward(f"\\boxed{{{final}}}", str(task["answer"])) if final is not None else 0.0,
    "qa_f1": lambda final, task: f1(final, str(task["answer"])) if final is not None else 0.0,
    "qa_em": lambda final, task: exact_match(final, str(task["answer"])) if final is not None else 0.0,
    "code": _code_reward,
}
NEEDS = {"math": ("question", "answer"), "qa_f1": ("question", "answer"), "qa_em": ("question", "answer"),
         "code": ("question", "tests", "entry_point")}
_FENCE = re.compile(r"```")


class ToolAgentEnv:
    roles = ROLES

    def __init__(self, style: str = "react", tools=("calculator",), max_tool_calls: int = 4, reward: str = "math",
                 corpus: str = "data/search_corpus.jsonl", search_k: int = 3):
        from config import ConfigError  # a ValueError that train.py prints as one line
        if reward not in REWARDS:
            raise ConfigError(f"config field data.env_kwargs.reward: unknown reward {reward!r}: known rewards are "
                             f"{', '.join(REWARDS)}")
        if style not in ("chat", "react", "code"):
            raise ConfigError(f"config field data.env_kwargs.style: unknown agent style {style!r}; "
                              "use chat, react or code")
        try:
            names = tool_names(tools)
        except ValueError as e:
            raise ConfigError(f"config field data.env_kwargs.tools: {e}") from None
        need_int("max_tool_calls", max_tool_calls, 1, 100)
        if "search" in names:
            need_file("corpus", corpus)
            need_int("search_k", search_k, 1, 1000)
        chosen = get_tools(names, search=search_tool(corpus, search_k) if "search" in names else None)
        self.style, self.max_calls, self.reward_name = style, max_tool_calls, reward
        self.tools = [t for t in chosen if t.name != "answer"] + ([ANSWER] if style == "react" else [])

    def fork(self):
        """A copy for ReMax's greedy twin: the tools (a BM25 index) are shared, the state copied."""
        import copy
        return copy.deepcopy(self, {id(t): t for t in self.tools})

    def reset(self, task):
        missing = [k for k in NEEDS[self.reward_name] if k not in task]
        if missing:
            raise ValueError(f"reward {self.reward_name!r} needs task field(s) {missing}; the task has {sorted(task)}")
        self.task, self.final, self.calls, self.errors, self.turns = task, None, 0, 0, 0
        self.codes, self._reward = [], None  # code the agent ran or answered with, in order
        self.messages = [{"role": "system", "content": system_prompt(self.style, self.tools, self.reward_name)},
                         {"role": "user", "content": str(task["question"])}]
        return Prompt("agent", list(self.messages))

    def step(self, reply: str):
        self.turns += 1
        reply = reply if isinstance(reply, str) else ""
        self.messages.append({"role": "assistant", "content": reply})
        obs = None
        if self.style == "react":
            call = parse_tool_call(reply, self.tools)
            if isinstance(call, ToolCall) and call.name == "answer":
                self.final = call.arguments["answer"]
            elif isinstance(call, ToolCall):
                if call.name == "python":
                    self.codes.append(call.arguments["code"])
                obs = call_tool(call, self.tools)
            elif isinstance(call, str):
                obs, self.errors = call, self.errors + 1
        elif self.style == "code" and _FENCE.search(reply) and (self.reward_name == "code"
                                                                or read_final(reply) is None):
            # code is run; a math/QA reply that already gives its answer ends instead (a code task's
            # replies never do: its answer is the function, and a reply without code ends it)
            code = extract_code(reply)
            self.codes.append(code)
            obs = call_tool(ToolCall("python", {"code": code}), [PYTHON])
        if obs is None or self.calls >= self.max_calls:
            if self.final is None:
                self.final = read_final(reply)
            if self.reward_name == "code":  # a finished function in the last reply or the answer
                for text in (reply, self.final):
                    if isinstance(text, str) and ("```" in text or "def " in text):
                        self.codes.append(extract_code(text))
            return None
        self.calls += 1
        self.messages.append(observation_message(obs))
        return Prompt("agent", list(self.messages))

    def solution(self) -> str:
        """Code reward: the last code that defines the entry point, else the last code under the
        task's prompt (a body alone); "" when the agent wrote none."""
        entry = str(self.task.get("entry_point", ""))
        for code in reversed(self.codes):
            if re.search(rf"def\s+{re.escape(entry)}\s*\(", code):
                return code
        return str(self.task.get("prompt", "")) + self.codes[-1] if self.codes else ""

    def reward(self) -> float:
        if self._reward is None:  # computed once: a code reward runs the tests in the sandbox
            out = self.solution() if self.reward_name == "code" else self.final
            self._reward = float(REWARDS[self.reward_name](out, self.task))
        return self._reward

    def turn_rewards(self):
        return [self.reward()] * self.turns

    def metrics(self):
        ok = self.reward() if self.turns else 0.0
        no_answer = (not self.codes) if self.reward_name == "code" else self.final is None
        return {"final_correct": ok, "team_reward": ok, "tool_calls": self.calls, "tool_errors": self.errors,
                "no_answer": float(no_answer)}


def aggregate(episodes) -> dict:
    ms = [e.metrics for e in episodes if e.metrics]
    n = max(1, len(ms))
    steps = [s for e in episodes for s in e.steps]
    return {"final_acc": sum(m.get("final_correct", 0.0) for m in ms) / n,
            "tool_calls": sum(m.get("tool_calls", 0.0) for m in ms) / n,
            "tool_errors": sum(m.get("tool_errors", 0.0) for m in ms) / n,
            "no_answer": sum(m.get("no_answer", 0.0) for m in ms) / n,
            "tokens/agent": sum(len(s.completion_ids) for s in steps) / max(1, len(steps))}


def load_tasks(spec: str) -> list[dict]:
    """Code tasks for `humaneval` or a file whose rows carry entry_point (rewards.code loaders),
    else question/answer tasks (data.math_data.load_math). Bad rows: DataError naming file:line."""
    from data.math_data import load_math, read_rows
    from data.code_data import load_code_tasks, load_humaneval
    if spec == "humaneval":
        return load_humaneval()
    if str(spec).endswith((".jsonl", ".json")):
        try:
            rows = read_rows(spec, "tasks")
        except (OSError, ValueError):
            rows = []  # the math loader below reports the problem, naming the file
        if rows and isinstance(rows[0][1], dict) and "entry_point" in rows[0][1]:
            return load_code_tasks(spec)
    return load_math(spec)

"""A single agent with tools over several turns (chat, ReAct or code-acting; agents/tool_agent.py),
its tools and its reward picked by name.

    reset(task) -> Prompt("agent", [system, user question])
    step(reply): a final answer (\\boxed{}, 'Answer:' or the answer tool) ends the episode; a tool call
                 (ReAct) or a ```python block (code style) runs and its output comes back as an
                 Observation; a malformed call comes back as an error observation; a reply with
                 neither ends the episode (its text is read for an answer).

Tools by name (runtime/tools.get_tools): calculator, python, search (BM25 over `corpus`), answer.
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

The scripted teacher (sft.py): `scripted_replies(task, style=..., tools=..., ...)` (the env's keywords,
defaults as configs/react_calculator.py) or an env's own `env.scripted_replies(task)` (its settings) is a
perfect agent: on the arithmetic data it calls the calculator (or python) on the computation, or writes
the ```python block (code style), or works it out (chat), then boxes the result; on the multi-step word
problems (data/multistep_data.py, rows with `steps`) it runs the worked solution as one program (a ```python
block, or the python tool) and boxes what it printed; on the search set it
searches the supporting documents hop by hop and boxes what they say. [] where it cannot solve the task
that way (a code task, a search question without the search tool, a question it cannot read).
"""
from __future__ import annotations

import re

from agents.tool_agent import observation_message, read_final, system_prompt
from data.multistep_data import run_steps, steps_program
from data.search_data import search_tool
from envs import Prompt, need_file, need_int
from envs.math_tool import solve_arith
from runtime.tools import ANSWER, PYTHON, ToolCall, call_tool, get_tools, parse_tool_call, tool_names
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

    def scripted_replies(self, task) -> list[str]:
        """A perfect agent's replies for this env's style, tools, reward and tool-call budget (module
        scripted_replies)."""
        search = next((t for t in self.tools if t.name == "search"), None)
        return _script(task, self.style, [t.name for t in self.tools], self.reward_name, self.max_calls,
                       getattr(search, "docs", None))

    def final_answer(self) -> str | None:
        """The answer the episode ended with (eval.py's majority vote); None for a code task (its answer is a
        function, which does not vote) or an episode without one."""
        return None if self.reward_name == "code" else self.final

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
    steps = [s for e in episodes for s in getattr(e, "samples", ())]  # compare.py: metrics only
    return {"final_acc": sum(m.get("final_correct", 0.0) for m in ms) / n,
            "tool_calls": sum(m.get("tool_calls", 0.0) for m in ms) / n,
            "tool_errors": sum(m.get("tool_errors", 0.0) for m in ms) / n,
            "no_answer": sum(m.get("no_answer", 0.0) for m in ms) / n,
            **({"tokens/agent": sum(len(s.completion_ids) for s in steps) / len(steps)} if steps else {})}


def load_tasks(spec: str) -> list[dict]:
    """Code tasks for `humaneval` or a file whose rows carry entry_point (rewards.code loaders),
    else question/answer tasks (data.math_data.load_math). Bad rows: DataError naming file:line."""
    from data.code_data import load_code_tasks, load_humaneval
    from data.math_data import load_math, read_rows
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


# --------------------------------------------------------------------------------------------
# the scripted teacher (sft.py): a perfect agent's replies, in turn order


def scripted_replies(task, style: str = "react", tools="calculator", reward: str = "math",
                     corpus: str = "data/search_corpus.jsonl", search_k: int = 3, max_tool_calls: int = 3,
                     ) -> list[str]:
    """A perfect agent's replies for an env built with these keywords (ToolAgentEnv's; the defaults are
    configs/react_calculator.py's, whose max_refinement_iterations=3 is the built-in route's
    max_tool_calls). [] for a task the teacher cannot solve in that setting."""
    names = tool_names(tools)
    docs = search_tool(corpus, search_k).docs if "search" in names and task.get("support") else None
    return _script(task, style, names, reward, max_tool_calls, docs)


def _script(task, style: str, names: list[str], reward: str, max_calls: int, docs) -> list[str]:
    if reward == "code":
        return []  # no teacher for code tasks here
    question, answer = str(task.get("question", "")), str(task.get("answer", ""))
    if task.get("support"):  # a search question: its supporting documents, hop by hop
        if style != "react" or "search" not in names or not docs:
            return []
        return _search_script(question, answer, task["support"], docs, max_calls)
    if task.get("steps") is not None:  # a multi-step word problem (data/multistep_data.py): its worked solution
        return _steps_script(task["steps"], answer, style, names)
    sol = solve_arith(question, answer)
    if sol is None:
        return []
    v = sol.value
    if style == "code":
        return [f"```python\n{sol.code}\n```", f"The code printed {v}.\n\\boxed{{{v}}}"]
    tool = next((n for n in names if n in ("calculator", "python")), None)
    if style == "chat" or tool is None:  # no tool to compute with: worked out by hand
        work = f"{sol.given} {sol.expression} = {v}." if sol.given else f"{sol.worked()}."
        return [f"{work}\n\\boxed{{{v}}}"]
    arg = sol.expression if tool == "calculator" else f"print({sol.expression})"
    seen = f"The calculator gives {v}." if tool == "calculator" else f"The code printed {v}."
    return [f"Thought: {sol.reason}\nAction: {tool}[{arg}]", f"Thought: {seen}\n\\boxed{{{v}}}"]


def _steps_script(steps, answer: str, style: str, names: list[str]) -> list[str]:
    """The worked solution run as one program (code style: a ```python block; react: the python tool), then the
    boxed answer; [] without a python tool to run it in, or for steps that do not give the task's answer."""
    program = steps_program(steps) if isinstance(steps, list) and all(isinstance(x, str) for x in steps) else None
    if program is None or str(run_steps(steps)[-1][1]) != answer.strip():
        return []
    v = run_steps(steps)[-1][1]
    if style == "code":
        return [f"```python\n{program}\n```", f"The code printed {v}.\n\\boxed{{{v}}}"]
    if style == "react" and "python" in names:
        one_line = "; ".join(program.splitlines())  # an Action's input is one line
        return [f"Thought: I compute it step by step in Python.\nAction: python[{one_line}]",
                f"Thought: The code printed {v}.\n\\boxed{{{v}}}"]
    return []


_BORN = re.compile(r"What is the capital of the country where (.{1,200}) was born\?")
_CITY = re.compile(r"In which country is the city of (.{1,200})\?")


def _search_script(question: str, answer: str, support, docs, max_calls: int) -> list[str]:
    """The data/search_data.py questions: search the person, then the city, then the country (two
    hops), or the city (one hop), each by its name; every fact the thoughts state is checked against
    the supporting document it comes from."""
    by_id = {d["id"]: d for d in docs}
    if not all(isinstance(i, str) and i in by_id for i in support) or len(support) > max_calls:
        return []
    ds = [by_id[i] for i in support]
    if (m := _BORN.fullmatch(question)) and len(ds) == 3:
        person, city, country = (d["title"] for d in ds)
        if not (person == m.group(1) and city in ds[0]["text"] and country in ds[1]["text"]
                and f"capital is {answer}" in ds[2]["text"]):
            return []
        return [f"Thought: First I find where {person} was born.\nAction: search[{person}]",
                f"Thought: {person} was born in {city}. Next, the country of {city}.\nAction: search[{city}]",
                f"Thought: {city} is in {country}. Now the capital of {country}.\nAction: search[{country}]",
                f"Thought: The capital of {country} is {answer}.\n\\boxed{{{answer}}}"]
    if (m := _CITY.fullmatch(question)) and len(ds) == 1:
        city = ds[0]["title"]
        if not (city == m.group(1) and f"city in {answer}" in ds[0]["text"]):
            return []
        return [f"Thought: I look up the city of {city}.\nAction: search[{city}]",
                f"Thought: {city} is a city in {answer}.\n\\boxed{{{answer}}}"]
    return []

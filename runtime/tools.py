"""Tools for agents: plain functions with a name, a description and a JSON-schema-like spec.

    calculator(expression)  safe arithmetic (an AST walk; no eval of arbitrary code)
    python(code)            runs the code in runtime/sandbox.py; returns stdout / stderr, truncated
    search(query)           BM25 (the `bm25s` package) over a local corpus; top-k passages
    answer(answer)          ends the episode with a final answer (the env handles it)

`get_tools(names, search=...)` picks them by name (`TOOL_NAMES`); an unknown name is a ValueError
listing the known ones. The tool runtime loads no data: the search tool is built over a corpus the
caller loaded (data.search_data.search_tool, once per (corpus, k)).

`tool_prompt(tools)` describes them for the model; `parse_tool_call(text)` reads a call
tolerantly: <tool_call>{"name": .., "arguments": {..}}</tool_call>, a ```json block with the same
object, or ReAct's `Action: name[args]` / `Action: name` + `Action Input: args`. A malformed or
unknown call gives an error observation for the model to read, never an exception; the reading is
linear in the reply's length (tests/test_hostile_text.py times it on 1 MB replies).
"""
from __future__ import annotations

import ast
import bisect
import json
import math
import operator
import re
import warnings
from dataclasses import dataclass
from typing import Callable

from runtime.sandbox import run_python

MAX_OBS = 2000  # characters of a tool observation shown to the model


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict  # {"type": "object", "properties": {...}, "required": [...]}
    fn: Callable[[dict], str]

    @property
    def main_arg(self) -> str:
        return self.parameters["required"][0]

    def spec(self) -> dict:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


MAX_ARG = 20_000  # characters kept of one tool argument


def _one_arg(name, desc):
    return {"type": "object", "properties": {name: {"type": "string", "description": desc}}, "required": [name]}


# --------------------------------------------------------------------------------------------
# calculator: an AST walk over numbers and arithmetic only

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UN = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUN = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max, "log": math.log, "exp": math.exp,
        "floor": math.floor, "ceil": math.ceil}


def _calc(node):
    if isinstance(node, ast.Expression):
        return _calc(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        a, b = _calc(node.left), _calc(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 1e6):
            raise ValueError("exponent too large")
        r = _BIN[type(node.op)](a, b)
        if isinstance(r, (int, float)) and abs(r) > 1e100:
            raise ValueError("result too large")
        return r
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UN:
        return _UN[type(node.op)](_calc(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUN and not node.keywords:
        return _FUN[node.func.id](*[_calc(a) for a in node.args])
    raise ValueError(f"unsupported expression: {ast.unparse(node)[:40]}")


def calculate(expression: str) -> str:
    expr = str(expression).replace("^", "**").replace("×", "*").replace("÷", "/").replace(",", "")
    if len(expr) > 200:
        return "error: expression too long"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # model text: "1st" and friends warn
            tree = ast.parse(expr.strip(), mode="eval")
        v = _calc(tree)
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError, TypeError, OverflowError, RecursionError, MemoryError) as e:
        return f"error: {type(e).__name__}: {e}"[:200]
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        v = int(v)
    return str(v)


CALCULATOR = Tool("calculator", "Evaluate an arithmetic expression, e.g. (3 + 4) * 2 / 7 or sqrt(16).",
                  _one_arg("expression", "the arithmetic expression"), lambda a: calculate(a["expression"]))


def run_code_ok(code: str, timeout: float = 5.0) -> tuple[str, bool]:
    """(observation text, ran cleanly) for code run in the sandbox."""
    r = run_python(code, timeout=timeout, cpu_s=max(1, int(timeout)))
    out = r.stdout[-MAX_OBS:]
    if r.reason != "ok":
        err = r.stderr.strip().splitlines()[-3:] if r.stderr.strip() else []
        out += ("\n" if out else "") + f"[{r.reason}] " + " | ".join(err)
    return out.strip() or "(no output)", r.ok


def run_code(code: str, timeout: float = 5.0) -> str:
    return run_code_ok(code, timeout)[0]


PYTHON = Tool("python", "Run Python code in a sandbox and return what it prints (print the result!).",
              _one_arg("code", "the Python code"), lambda a: run_code(a["code"]))


class SearchTool(Tool):
    """BM25 over docs [{"id", "title", "text"}], built once per corpus."""

    def __init__(self, docs: list[dict], k: int = 3):
        import bm25s
        self.docs, self.k = docs, k
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize([f"{d['title']}. {d['text']}" for d in docs], stopwords="en",
                                            show_progress=False), show_progress=False)
        super().__init__("search", "Search the document collection; returns the most relevant passages.",
                         _one_arg("query", "what to look for"), lambda a: self.format(self.search(a["query"])))

    def search(self, query: str) -> list[dict]:
        import bm25s
        q = bm25s.tokenize([str(query)], stopwords="en", show_progress=False)
        if not q.vocab or not any(len(x) for x in q.ids):
            return []
        idx, scores = self.retriever.retrieve(q, k=min(self.k, len(self.docs)), show_progress=False)
        return [self.docs[int(i)] for i, s in zip(idx[0], scores[0]) if s > 0]

    @staticmethod
    def format(docs: list[dict]) -> str:
        return "\n".join(f"[{d['id']}] {d['title']}: {d['text']}" for d in docs)[:MAX_OBS] or "(no results)"


ANSWER = Tool("answer", "Give the final answer and end.", _one_arg("answer", "the final answer"), lambda a: a["answer"])


# name -> how to build it: the one place tools are named (configs pick them by these names)
TOOL_NAMES = ("calculator", "python", "search", "answer")


def tool_names(names) -> list[str]:
    """Checked tool names, in order, once each: a sequence of names or one comma/space separated
    string ("search, calculator": what a scalar env_kwargs value can hold). An unknown name is a
    ValueError listing the known ones."""
    if isinstance(names, str):
        names = re.split(r"[,\s]+", names)
    names = [str(x).strip() for x in names if str(x).strip()]
    unknown = [x for x in names if x not in TOOL_NAMES]
    if unknown:
        raise ValueError(f"unknown tool(s) {unknown}: known tools are {', '.join(TOOL_NAMES)}")
    return list(dict.fromkeys(names))


def get_tools(names, search: SearchTool | None = None) -> list[Tool]:
    """The tools named (see tool_names); `search` is the given SearchTool (BM25 over a corpus the caller
    loaded: data.search_data.search_tool), needed only when "search" is named."""
    names = tool_names(names)
    if "search" in names and search is None:
        raise ValueError("the search tool needs its corpus: pass search=data.search_data.search_tool(path, k)")
    build = {"calculator": lambda: CALCULATOR, "python": lambda: PYTHON, "answer": lambda: ANSWER, "search": lambda: search}
    return [build[x]() for x in names]


def tool_prompt(tools: list[Tool]) -> str:
    lines = ["You can call these tools:"]
    for t in tools:
        lines.append(json.dumps(t.spec()))
    lines.append('Call one tool per reply as <tool_call>{"name": "<tool>", "arguments": {"<arg>": "<value>"}}</tool_call> '
                 "and wait for its result.")
    return "\n".join(lines)


@dataclass
class ToolCall:
    name: str
    arguments: dict


def _loads(s: str):
    """JSON, else a Python literal (single quotes); None if neither. Never raises: 100k-deep nesting
    (RecursionError) and 5000-digit integers (ValueError past Python's int-string limit) are None."""
    try:
        return json.loads(s)
    except (ValueError, RecursionError, MemoryError):
        try:
            return ast.literal_eval(s) if len(s) < 100_000 else None
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None


def parse_tool_call(text: str, tools: list[Tool]) -> ToolCall | str | None:
    """A ToolCall, an error message (str) for a malformed call, or None when the reply calls nothing.
    Never raises, whatever the reply (tests/test_sandbox.py feeds it hostile ones)."""
    if not isinstance(text, str):
        return None
    try:
        return _parse_tool_call(text, tools)
    except Exception as e:  # noqa: BLE001 — a reply must never crash the episode
        return f"error: could not read the tool call ({type(e).__name__})"


# Every scan below is linear in the reply: str.find loops and regexes whose quantifiers are bounded
# or end at a fixed character. (A lazy `.*?` followed by `\s*` and an alternative is quadratic:
# "<tool_call>a" + 64k spaces + "b" took 53 s with the old `<tool_call>\s*(.*?)\s*(?:</tool_call>|$)`.)
_OPEN, _CLOSE, _FENCE = "<tool_call>", "</tool_call>", "```"
_ACTION = re.compile(r"Action\s*:\s*([A-Za-z_]\w*)")
_ACTION_INPUT = re.compile(r"Action\s*Input\s*:")
_BLANKS = re.compile(r"[^\S\n]*")


def _tagged(text: str) -> list[str]:
    """The bodies of <tool_call> ... </tool_call> (the last one may be unclosed), stripped."""
    out, i = [], text.find(_OPEN)
    while i >= 0:
        start = i + len(_OPEN)
        end = text.find(_CLOSE, start)
        out.append(text[start:end if end >= 0 else len(text)].strip())
        i = text.find(_OPEN, end + len(_CLOSE)) if end >= 0 else -1
    return out


def _fenced_json(text: str) -> list[str]:
    """The {...} bodies of ``` / ```json fenced blocks, in order (a fence pairs with the next one)."""
    parts = text.split(_FENCE)  # parts[1], parts[2], ...: what lies between consecutive fences
    out, k = [], 1
    while k < len(parts) - 1:
        body = parts[k].removeprefix("json").strip()
        if body.startswith("{") and body.endswith("}"):
            out.append(body)
            k += 2  # the closing fence is used up
        else:
            k += 1
    return out


def _react(text: str) -> tuple[str, str | None, int] | None:
    """(name, bracketed argument or None, end of its line) of the last `Action: name[args]` or
    `Action: name`: after the name, the rest of its line is blank or one [...] (up to the line's last
    `]`). Each line's end and trailing blanks are measured once, however many `Action:` it holds."""
    newlines = [m.start() for m in re.finditer("\n", text)]
    found, at, rstripped = None, 0, {}
    while (m := _ACTION.search(text, at)) is not None:
        k = bisect.bisect_left(newlines, m.end())
        eol = newlines[k] if k < len(newlines) else len(text)
        if eol not in rstripped:
            bol = newlines[k - 1] + 1 if k else 0
            rstripped[eol] = bol + len(text[bol:eol].rstrip(" \t"))
        rs_end, j = rstripped[eol], _BLANKS.match(text, m.end(), eol).end()
        if j >= rs_end:
            found, at = (m.group(1), None, eol), eol
        elif text[j] == "[" and text[rs_end - 1] == "]" and rs_end - j >= 2:
            found, at = (m.group(1), text[j + 1:rs_end - 1], eol), eol
        else:
            at = m.start() + 1  # not a call: the next one may overlap it ("Action:Action: calculator[1]")
    return found


def _parse_tool_call(text: str, tools: list[Tool]) -> ToolCall | str | None:
    by_name = {t.name: t for t in tools}
    obj = None
    m = _tagged(text)
    if m:
        obj = _loads(m[-1])
        if obj is None:
            return "error: the tool call is not valid JSON"
    else:
        m = _fenced_json(text)
        if m and '"name"' in m[-1]:
            obj = _loads(m[-1])
    if obj is not None:
        if not isinstance(obj, dict) or "name" not in obj:
            return 'error: a tool call needs {"name": ..., "arguments": {...}}'
        name, args = obj["name"], obj.get("arguments", obj.get("args", {}))
        if not isinstance(name, str):
            return f"error: the tool name must be a string; available: {', '.join(by_name)}"
        if isinstance(args, str):
            args = _loads(args) if args.strip().startswith("{") else args
        if name not in by_name:
            return f"error: unknown tool {name!r}; available: {', '.join(by_name)}"
        if not isinstance(args, dict):
            args = {by_name[name].main_arg: str(args)}
        missing = [r for r in by_name[name].parameters["required"] if r not in args]
        if missing:
            return f"error: tool {name!r} needs argument(s) {missing}"
        return ToolCall(name, {str(k): str(v)[:MAX_ARG] for k, v in args.items()})
    # ReAct: "Action: name[args]" or "Action: name" + "Action Input: args"
    act = _react(text)
    if act:
        name, arg, end = act
        if arg is None:
            inp = _ACTION_INPUT.search(text, end)
            arg = text[inp.end():].strip() if inp and inp.end() < len(text) else None
        if name not in by_name:
            return f"error: unknown tool {name!r}; available: {', '.join(by_name)}"
        if arg is None:
            return f"error: tool {name!r} needs an input: Action: {name}[...]"
        return ToolCall(name, {by_name[name].main_arg: arg.strip().strip('"').strip("'")})
    if re.search(r"Action\s*:", text) or "<tool_call" in text:
        return "error: could not read the tool call; write Action: <tool>[<input>]"
    return None


def call_tool(call: ToolCall, tools: list[Tool]) -> str:
    """Run a parsed call; any failure becomes an error observation."""
    tool = next(t for t in tools if t.name == call.name)
    try:
        return str(tool.fn(call.arguments))[:MAX_OBS]
    except Exception as e:  # noqa: BLE001
        return f"error: {type(e).__name__}: {e}"[:MAX_OBS]

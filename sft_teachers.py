"""The teachers that write SFT examples where the truth is known (sft.py's step 4), and the Example
they write (sft.py trains on these):
  math_teacher      the math team's judge: balanced critiques of right and wrong solutions, each with the
                    right verdict (and the judge's check line when its prompt asks for one)
  scripted_teacher  any workflow: a scripted perfect team's replies (the env's or its module's
                    scripted_replies(task)) played through a fresh env; every turn is an example
  tokenize          an Example's token ids: prompt + reply (+ EOS), the loss on the reply
  teacher_code      per file, a hash of the code that writes a workflow's teacher turns and pays them
                    (what a finished SFT or recipe stage records, so an older teacher's output is not
                    reused; docstrings and comments do not count)
Plain Python over a tokenizer: no torch, no model."""
from __future__ import annotations

import ast
import hashlib
import inspect
import math
import sys
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import chat
from agents.math_team import (blind_messages, build_messages, check_line, digit_check_line, digit_consistent,
                              digit_verdict, whole)
from envs import play_replies
from rewards.math import _last_boxed, extract_answer, math_reward

GENERATORS = ("generator_initial", "generator_refinement", "solver")


@dataclass
class Example:
    adapter: str
    role: str
    prompt: str  # chat-formatted text, as the role saw it
    reply: str
    eos: bool  # append EOS: the reply ended on its own
    source: str  # where it came from: a file:line, "rejection", "teacher:own_wrong", ...
    reward: float | None = None
    ids: list = field(default_factory=list)
    n_prompt: int = 0
    spans: list = field(default_factory=list)
    """[(start, end)] of every reply's tokens when several turns share these ids (sft_train.pack_conversations);
    empty: the one reply, ids[n_prompt:]"""
    messages: list | None = None
    """the chat messages `prompt` was rendered from, where a teacher built it: the ids come from them
    (chat.chat_ids: a content's text never becomes a control token)"""
    prompt_ids: list | None = None
    """a trajectory file's ids of the prompt (its `prompt_ids`): used where they decode to `prompt` with this
    tokenizer; the text is encoded only for a file without them (its written `<|im_end|>` is then a control token)"""

    def reply_spans(self) -> list:
        return self.spans or [(self.n_prompt, len(self.ids))]

    def turns(self) -> int:
        return len(self.spans) or 1

    def reply_tokens(self) -> int:
        return sum(b - a for a, b in self.reply_spans())


def tokenize(ex: Example, tok) -> Example:
    """ids = prompt tokens + reply tokens (+ EOS); the loss covers ids[n_prompt:]. The reply is plain text: a
    `<|im_end|>` written in it (a hostile data file's) is taught as the characters it is, never as a turn
    boundary (chat.plain_ids); the prompt from its messages where a teacher built it (chat.chat_ids), else a
    trajectory file's prompt ids, else (an older file) its rendered prompt text."""
    if ex.messages is not None:
        p = chat.chat_ids(tok, ex.messages)
    elif ex.prompt_ids and max(ex.prompt_ids) < len(tok) and tok.decode(ex.prompt_ids) == ex.prompt:
        p = list(ex.prompt_ids)
    else:
        p = tok(ex.prompt, add_special_tokens=False)["input_ids"]
    r = chat.plain_ids(tok, ex.reply) + ([tok.eos_token_id] if ex.eos else [])
    ex.ids, ex.n_prompt = p + r, len(p)
    return ex



# --------------------------------------------------------------------------------------------
# 4. the math teacher: balanced critiques with the right verdict


def perturb(solution: str, answer: str, rng: random.Random, accept=None) -> str | None:
    """`solution` with its last \\boxed{} answer changed to a nearby wrong number (one `accept(text)` takes,
    when given); None when the answer is not a plain number or the solution has no \\boxed{}."""
    boxed = _last_boxed(solution)
    try:
        x = float(str(answer).replace(",", ""))
    except ValueError:
        return None
    if boxed is None or not math.isfinite(x):
        return None
    cands = [x + 1, x - 1, x + 2, x - 2, x + 10, 2 * x, x / 2]
    for y in rng.sample(cands, len(cands)):
        y_txt = str(int(y)) if float(y).is_integer() else f"{y:g}"
        i = solution.rfind("\\boxed{" + boxed + "}")
        if i < 0:
            return None
        wrong = solution[:i] + "\\boxed{" + y_txt + "}" + solution[i + len(boxed) + 8:]
        if math_reward(wrong, answer) == 0.0 and (accept is None or accept(wrong)):
            return wrong
    return None


def teacher_critique(solution: str, answer: str, right: bool, check: bool = False) -> str:
    """A short calibrated critique that answers FIRST and compares second: "I get \\boxed{y}. The
    solution says x: the same/different." then the verdict line. Answer-first matters: a critique that
    restates the solution's answer before its own teaches a small model to copy that answer (measured
    on SmolLM2-135M, docs/recipes.md). ~20 tokens, inside the demo evaluator's 32."""
    mine = check_line(answer) if check else f"I get \\boxed{{{answer}}}."  # check: the evaluator_check prompt's line
    return f"{mine} {teacher_verdict(solution, right)}"


def teacher_verdict(solution: str, right: bool) -> str:
    """The comparison and the verdict line, after the teacher's own result: "The solution says x: the
    same." / "...: different." (the evaluator_blind judge's verdict turn is exactly this)."""
    said = extract_answer(solution)
    said = None if said is None else " ".join(said.split())[:60]
    if said is None:
        return "The solution gives no final answer.\nVerdict: Incorrect"
    return f"The solution says {said}: {'the same' if right else 'different'}.\nVerdict: " + \
        ("Correct" if right else "Incorrect")


def teacher_digit_verdict(solution: str, truth: str, right: bool) -> str:
    """The evaluator_digit judge's verdict turn: the solution's answer against the check's sign and last
    digit ("The solution says 120: it ends in 0, not 8.\nVerdict: Incorrect"; agents.math_team.digit_verdict).
    The teacher only shows it wrong solutions that fail the check, so the verdict that follows the check is
    also the true one."""
    said, t = extract_answer(solution), whole(truth)
    return digit_verdict(said, t if right else whole(said), (t.startswith("-"), t[-1]))[1]


STYLES = ("plain", "check", "blind", "digit")  # env_kwargs evaluator_prompt


def solution_pool(records, tasks, digit: bool = False) -> dict[str, dict]:
    """question -> {"answer", "right": [(text, prompt)], "wrong": [...]}: the generators' solutions in the
    trajectory records, right or wrong by math_reward, each with (prompt text, prompt ids) the evaluator
    judged it with (None where no evaluator turn follows or a blind judge's prompt holds no solution); then
    every task of `tasks` not there yet, with none. digit: a wrong answer the sign-and-last-digit check
    cannot catch is left out (the teacher would have to guess)."""
    pool: dict[str, dict] = {}

    def entry(task):
        return pool.setdefault(str(task["question"]), {"answer": str(task["answer"]), "right": [], "wrong": []})

    for _, rec in records:
        task = rec.get("task") or {}
        if task.get("question") is None or task.get("answer") is None:
            continue
        e, turns = entry(task), rec["turns"]
        for i, t in enumerate(turns):
            if t["role"] not in GENERATORS:
                continue
            nxt = turns[i + 1] if i + 1 < len(turns) and turns[i + 1]["role"] == "evaluator_critique" else None
            prompt = nxt.get("prompt") if nxt else None  # the exact prompt the evaluator judged it with
            if prompt is not None and t["reply"].strip() not in prompt:  # a blind judge's check: no solution in it
                prompt = None
            prompt = (prompt, nxt.get("prompt_ids")) if prompt is not None else None
            ok = math_reward(t["reply"], e["answer"]) == 1.0
            if digit and not ok and digit_consistent(extract_answer(t["reply"]), e["answer"]):
                continue  # a wrong answer the digit check cannot catch: the teacher would have to guess
            e["right" if ok else "wrong"].append((t["reply"], prompt))
    for task in tasks:
        if task.get("question") is not None and task.get("answer") is not None:
            entry(task)
    return pool


def pick_pair(e: dict, rng: random.Random, digit: bool = False) -> tuple[tuple, tuple]:
    """One pool entry's ((right solution, prompt), source), ((wrong solution, prompt), source): the model's own
    where it has them (drawn with rng), else a synthetic right one and a perturbed wrong one (digit: one the
    digit check catches). The wrong pair is (None, None) when there is none."""
    y = e["answer"]
    right = rng.choice(e["right"]) if e["right"] else None
    src_right = "teacher:own_right" if right else "teacher:synthetic_right"
    if right is None:
        text = f"Working it out step by step gives {y}.\nSo the final answer is \\boxed{{{y}}}."
        right = (text, None)
    if e["wrong"]:
        wrong, src_wrong = rng.choice(e["wrong"]), "teacher:own_wrong"
    else:
        base = right[0] if _last_boxed(right[0]) is not None else f"The result is \\boxed{{{y}}}."
        bad = perturb(base, y, rng, (lambda w: whole(extract_answer(w)) is not None and  # x/2: no digit to read
                                     not digit_consistent(extract_answer(w), y)) if digit else None)
        wrong, src_wrong = ((bad, None), "teacher:perturbed") if bad is not None else (None, None)
    return (right, src_right), (wrong, src_wrong)


def math_teacher(records, tasks, tok, adapter: str, n_tasks: int, seed: int,
                 style: str = "plain") -> tuple[list[Example], dict]:
    """Balanced evaluator_critique examples: per task one critique of a correct and one of an incorrect
    solution (see the module docstring for where the solutions come from). Returns (examples, counts).
    style is the judge's env_kwargs evaluator_prompt: "plain" critiques; "check", each critique opening
    with its check line (the prompts built in that style, never taken from the trajectories); "blind",
    per task its check turn (the problem only -> the check line, counted as teacher:check) and each
    verdict turn after it; "digit", the same with the sign-and-last-digit check (its wrong solutions
    are ones that check catches: own samples that fail it, else a perturbation that does)."""
    if style not in STYLES:
        raise ValueError(f"math teacher: evaluator_prompt must be one of {STYLES}, got {style!r}")
    check, blind, digit = style == "check", style in ("blind", "digit"), style == "digit"
    kind = "evaluator_digit" if digit else "evaluator_blind"  # a blind judge's prompt style
    if digit:  # the check needs a digit: the teacher keeps whole-number tasks only
        tasks = [t for t in tasks if whole(str(t.get("answer"))) is not None]
        records = [(src, r) for src, r in records if whole(str((r.get("task") or {}).get("answer"))) is not None]
    rng = random.Random(seed)

    def render(msgs):
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    pool = solution_pool(records, tasks, digit)
    chosen = list(pool.items())[:n_tasks] if n_tasks else list(pool.items())
    out, counts = [], defaultdict(int)
    for q, e in chosen:
        y = e["answer"]
        (right, src_right), (wrong, src_wrong) = pick_pair(e, rng, digit)
        if wrong is None:
            counts["tasks_without_incorrect"] += 1
            continue
        if blind:
            line = digit_check_line(q, y) if digit else check_line(y)
            msgs = blind_messages(q, None, [], kind)
            out.append(Example(adapter, "evaluator_critique", render(msgs), line, True, "teacher:check", messages=msgs))
            counts["teacher:check"] += 1
        for (sol, prompt), ok, src in ((right, True, src_right), (wrong, False, src_wrong)):
            if blind:
                msgs = blind_messages(q, line, [("generator_initial", sol)], kind)
                verdict = teacher_digit_verdict(sol, y, ok) if digit else teacher_verdict(sol, ok)
                out.append(Example(adapter, "evaluator_critique", render(msgs), verdict, True, src, messages=msgs))
                counts[src] += 1
                continue
            msgs, ids = None, None  # else the recorded prompt the evaluator judged it with (a trajectory file's)
            if prompt is None or check:
                msgs = build_messages("evaluator_check" if check else "evaluator_critique", q, [("generator_initial", sol)])
                prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            else:
                prompt, ids = prompt
            out.append(Example(adapter, "evaluator_critique", prompt, teacher_critique(sol, y, ok, check), True, src,
                               messages=msgs, prompt_ids=ids))
            counts[src] += 1
    return out, dict(counts)


def scripted_teacher(make_env, module, tasks, tok, adapter_of: dict, roles, n_tasks: int,
                     min_reward: float) -> tuple[list[Example], dict]:
    """Examples from a scripted perfect team: the env's `scripted_replies(task)` method, else the workflow
    module's function (replies in turn order), played through a fresh env per task; each turn the env asked for gives (the
    chat-formatted prompt that role saw -> the scripted reply) when its env reward >= min_reward.
    Where the workflow also defines `scripted_repair(task)` (the code team, the math team with derived
    verdicts: [a near-miss first reply, (the judge's turns,) the fix]), that episode is played too and every
    turn after its first is kept the same way: the roles a perfect team never calls (the refiner) get their
    lessons. The first reply, the mistake, is never taught.
    Returns (examples, counts: per role kept, below min_reward, and mistakes left out)."""
    probe = make_env()
    if not hasattr(module, "scripted_replies") and not hasattr(probe, "scripted_replies"):
        raise ValueError(f"teacher=scripted: the workflow module {module.__name__} defines no scripted_replies(task)")
    episodes = [("scripted_replies", "scripted", 0)] + \
        ([("scripted_repair", "repair", 1)] if hasattr(module, "scripted_repair") or hasattr(probe, "scripted_repair") else [])
    out, counts = [], defaultdict(int)

    def play(task, method, source, skip):
        env = make_env()  # the env's own method when it has one: it knows its env_kwargs (corpus, budgets, style)
        fn = getattr(env, method, None) or getattr(module, method)
        seen = play_replies(env, task, fn(task) or ())
        for k, ((t, reply), r) in enumerate(zip(seen, env.turn_rewards())):
            if k < skip:
                counts[f"teacher:mistake/{t.role}"] += 1
                continue
            if t.role not in roles:
                continue
            if r < min_reward:
                counts[f"teacher:below_min_reward/{t.role}"] += 1
                continue
            prompt = tok.apply_chat_template(t.messages, add_generation_prompt=True, tokenize=False)
            out.append(Example(adapter_of[t.role], t.role, prompt, reply, True, f"teacher:{source}", float(r),
                               messages=t.messages))
            counts[f"teacher:{source}/{t.role}"] += 1

    for task in (tasks[:n_tasks] if n_tasks else tasks):
        for method, source, skip in episodes:
            play(task, method, source, skip)  # scripted_repair may give None (no lesson for this task)
    return out, dict(counts)


_PACKAGES = ("agents", "envs", "rewards", "runtime", "data")  # troupe's folders: what a teacher's code is made of


def _module_file(name: str) -> Path | None:
    """The file of a troupe module named in code ("data.code_data", or "envs" for its package), else None."""
    import importlib.util
    if name.split(".")[0] not in _PACKAGES:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _names(code) -> set[str]:
    """Every name a code object and the code objects inside it use (imports included: `from data.code_data
    import x` puts "data.code_data" among them, at module level or inside a function)."""
    out, todo = set(), [code]
    while todo:
        c = todo.pop()
        out.update(c.co_names)
        todo += [k for k in c.co_consts if inspect.iscode(k)]
    return out


def teacher_sources(module, loader=None) -> list[Path]:
    """The files whose code writes a workflow's teacher turns and pays them: this file, the workflow's module,
    the module of its task loader, and the troupe modules (agents/, envs/, rewards/, runtime/, data/: prompts,
    parsers, rewards, the sandbox and tools, data) they import, anywhere in their code, and theirs in turn."""
    seeds = [getattr(module, "__file__", None)]
    if loader is not None:  # a loader may be a lambda in workflows.py: what it calls
        cv = inspect.getclosurevars(loader) if inspect.isfunction(loader) else None
        for f in [loader, *((cv.nonlocals | cv.globals).values() if cv else ())]:
            mod = sys.modules.get(getattr(f, "__module__", None) or "")
            if mod is not None and mod.__name__.split(".")[0] in _PACKAGES:
                seeds.append(mod.__file__)
    seen, todo = set(), [Path(f).resolve() for f in seeds if f]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        try:
            code = compile(f.read_text(), str(f), "exec")
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        todo += [p for p in map(_module_file, _names(code)) if p is not None]
    return sorted(seen | {Path(__file__).resolve()})


def _code_hash(path: Path) -> str:
    """sha256 of a file's code: its syntax tree without docstrings (comments are not in it), so an edit of
    words only leaves it unchanged; the bytes where it does not parse."""
    text = path.read_bytes()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return hashlib.sha256(text).hexdigest()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def teacher_code(module, loader=None) -> dict:
    """{file (relative to the repo where it is inside it): the hash of its code} over teacher_sources."""
    root = Path(__file__).resolve().parent
    return {str(f.relative_to(root)) if f.is_relative_to(root) else str(f): _code_hash(f)
            for f in teacher_sources(module, loader)}

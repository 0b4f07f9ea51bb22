"""The scripted perfect teachers of math_tool and react (`scripted_replies`, sft.py's teacher=scripted):
on the train tasks their configs load (workflows.load_data: configs/math_tool.py, configs/react_calculator.py
and the react styles / tools / rewards the env supports), every turn scores the env's maximum; the same
replies for a perturbed number (or another question's answer) score 0, so the reward is not constant;
and sft.scripted_teacher turns them into examples for every role with the tiny model's tokenizer.
Workflows whose turns run the sandbox (~70 ms a run) play a deterministic sample of every level; the
teacher's computation is checked on every train task."""
import dataclasses
import functools
import os
import re
import types

import pytest

from config import load_config_file
from envs import math_tool, react
from envs.math_tool import solve_arith
from workflows import load_data, workflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "data", "search_corpus.jsonl")
SANDBOX_SAMPLE = 24  # tasks played through a workflow whose turns run the sandbox


def config(name: str, **data):
    cfg = load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))
    data.setdefault("train_files", os.path.join(ROOT, cfg.data.train_files))
    data.setdefault("val_files", os.path.join(ROOT, cfg.data.val_files))
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data)).validate()


@functools.cache
def _train(name: str, env_kwargs: tuple = (), search: bool = False):
    """(config, train tasks) the way train.py loads them; env_kwargs as sorted items."""
    extra = {"env_kwargs": dict(env_kwargs)} if env_kwargs else {}
    if search:
        extra.update(train_files=os.path.join(ROOT, "data", "search_train.jsonl"),
                     val_files=os.path.join(ROOT, "data", "search_val.jsonl"), levels=None)
    cfg = config(name, **extra)
    return cfg, load_data(cfg)[0]


def sample(tasks, n):
    """About n tasks, deterministic: every k-th task of each kind (level and operators), so all kinds are in."""
    if len(tasks) <= n:
        return tasks
    kinds = {}
    for t in tasks:
        kinds.setdefault((t.get("level"), tuple(re.findall(r" [-+*/] ", t["question"]))), []).append(t)
    per = -(-n // len(kinds))
    return [t for group in kinds.values() for t in group[::-(-len(group) // per)]]


def play(env, task, replies):
    """(roles, turn rewards, metrics, observations the agent was shown after each of its turns)."""
    turn, roles, obs = env.reset(task), [], []
    for r in replies:
        assert turn is not None, "the episode ended before the teacher's last reply"
        roles.append(turn.role)
        turn = env.step(r)
        if turn is not None:
            obs.append(turn.messages[-1]["content"])
    assert turn is None, "the episode did not end after the teacher's last reply"
    return roles, env.turn_rewards(), env.metrics(), obs


def bump_last_number(question: str) -> str:
    """The same question with its last number one larger: a wrong computation in the same format."""
    m = list(re.finditer(r"\d+", question))[-1]
    return question[:m.start()] + str(int(m.group()) + 1) + question[m.end():]


def numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


def wrong_task(task):
    """A perturbed task whose teacher replies are well formed but compute another number."""
    q = bump_last_number(task["question"])
    sol = solve_arith(q)
    assert sol is not None and sol.value != task["answer"]
    return {**task, "question": q, "answer": sol.value}


# ---------------------------------------------------------------------------------- math_tool


def test_math_tool_teacher_solves_every_train_task():
    """configs/math_tool.py's train tasks (arith_train, levels 2, 3, 5): the teacher reads every one, its
    computation gives the true answer, and its replies are plan, one ```python block, one \\boxed{}."""
    _, tasks = _train("math_tool")
    assert len(tasks) == 1289 and {t["level"] for t in tasks} == {2, 3, 5}
    for t in tasks:
        plan, code, check = math_tool.scripted_replies(t)
        sol = solve_arith(t["question"], t["answer"])
        assert sol.value == t["answer"] and sol.expression in plan and f"print({sol.expression})" not in plan
        assert code.startswith("```python\n") and code.endswith("\n```") and "print(" in code
        steps = re.sub(r"(?m)^\d+\. ", "", plan)
        assert numbers(steps) | numbers(code) <= numbers(t["question"])  # it names the computation, no result
        assert check.endswith(f"\\boxed{{{t['answer']}}}")
        assert math_tool.plan_expression(plan) == sol.expression and math_tool.plan_right(plan, t["answer"])
        assert not math_tool.plan_right(math_tool.scripted_replies(wrong_task(t))[0], t["answer"])


def test_math_tool_teacher_scores_the_maximum():
    """Through the configured env (max_refinement_iterations=2, the sandbox): analyzer, executor and
    verifier each earn 1, in one cycle, on a sample of every level of the train tasks."""
    cfg, tasks = _train("math_tool")
    make_env = workflow(cfg)[0]
    picked = sample(tasks, SANDBOX_SAMPLE)
    assert {t["level"] for t in picked} == {2, 3, 5}
    for t in picked:
        roles, rew, m, _ = play(make_env(), t, math_tool.scripted_replies(t))
        assert roles == ["analyzer", "executor", "verifier"] and rew == [1.0, 1.0, 1.0], t
        assert (m["team_reward"], m["exec_right"], m["cycles"], m["no_answer"]) == (1.0, 1.0, 1, 0.0)


def test_math_tool_wrong_replies_score_less():
    """The teacher's replies for a perturbed number, played on the true task: every turn earns 0; a
    right computation boxed wrong costs the verifier and the team, not the executor."""
    cfg, tasks = _train("math_tool")
    make_env = workflow(cfg)[0]
    for t in sample(tasks, 5):
        _, rew, m, _ = play(make_env(), t, math_tool.scripted_replies(wrong_task(t)))
        assert rew == [0.0, 0.0, 0.0] and m["team_reward"] == 0.0 and m["exec_right"] == 0.0, t
        plan, code, _ = math_tool.scripted_replies(t)
        bad = int(t["answer"]) + 1
        _, rew, m, _ = play(make_env(), t, [plan, code, f"The code printed {bad}.\n\\boxed{{{bad}}}"])
        assert rew == [0.0, 1.0, 0.0] and m["team_reward"] == 0.0


def test_math_tool_plan_reward_pays_the_analyzer_for_its_own_plan():
    """analyzer_reward="plan" (configs/cpu/math_tool.py): the analyzer earns 1 when the last computation its
    plan writes out gives the answer, whatever the others then do; a plan that drops the give-away term earns
    0 even when the executor and verifier still get the team right. "team" (the default) pays it the team
    reward on the same replies. The metric plan_right is the plan's score under both."""
    _, tasks = _train("math_tool")
    t = next(t for t in tasks if " gives " in t["question"])
    plan, code, check = math_tool.scripted_replies(t)
    expr = solve_arith(t["question"]).expression
    dropped = plan.replace(expr, expr.rsplit(" - ", 1)[0])
    assert dropped != plan and not math_tool.plan_right(dropped, t["answer"])
    for reward, replies, want, team, planned in (
            ("plan", [plan, code, check], [1.0, 1.0, 1.0], 1.0, 1.0),
            ("plan", [dropped, code, check], [0.0, 1.0, 1.0], 1.0, 0.0),
            ("team", [dropped, code, check], [1.0, 1.0, 1.0], 1.0, 0.0),
            ("plan", ["1. Print the answer.", code, check], [0.0, 1.0, 1.0], 1.0, 0.0)):
        _, rew, m, _ = play(math_tool.MathToolEnv(analyzer_reward=reward), t, replies)
        assert (rew, m["team_reward"], m["plan_right"]) == (want, team, planned), (reward, replies[0])
    recipe_env = workflow(config("cpu/math_tool"))[0]()  # the CPU recipe pays the plan
    assert play(recipe_env, t, [dropped, code, check])[1] == [0.0, 1.0, 1.0]


def test_plan_expression_reads_the_last_computation_written_out():
    """The last computation a plan writes on one line, in the calculator's spelling; stray parentheses at its
    ends dropped; a computation a 4000-character cut splits is not read; a bare number is none."""
    cases = {"1. Compute 16 + 9 * 9, doing * and / before + and -.\n2. Print the result.": "16 + 9 * 9",
             "Add them: 16 + 17 - 12. Then print.": "16 + 17 - 12", "1. Compute (3 + 4) * 2.": "(3 + 4) * 2",
             "Take -5 - -3, then 2.5 * 2": "2.5 * 2", "1. The answer is 21.\n2. Print it.": None, "": None,
             "(i.e. 30 + 17 - 6)": "30 + 17 - 6", "( 30 + 17 ) - 6": "(30 + 17) - 6", "30 + ( 17 - 6 )": "30 + (17 - 6)",
             "24 + 6 × 6": "24 + 6 * 6", "24 + 6 \\times 6": "24 + 6 * 6", "30 + 17 − 6": "30 + 17 - 6",
             "given away.30 + 17 - 6": "30 + 17 - 6", "30 + 17 - 6\n- 6 given away": "30 + 17 - 6",
             "2^3 + 33": "2^3 + 33", "٣ + ٤": None,
             "x" * 3990 + " 30 + 17 - 6": "30 + 17 - 6", "30 + 17 - 6 " + "x" * 3990: None,
             "1 + 1. 2 + 2" + "x" * 3988: "2 + 2"}
    for plan, want in cases.items():
        assert math_tool.plan_expression(plan) == want, plan[:40]
    assert math_tool.plan_right("so 7 / 2", "7/2") and math_tool.plan_right("so 7 / 2", "3.5")
    assert math_tool.plan_right("(i.e. 30 + 17 - 6)", "41") and math_tool.plan_right("24 + 6 × 6", "60")
    assert not math_tool.plan_right("1 / 0", "0") and not math_tool.plan_right("(3 + 4", "8")
    assert math_tool.plan_right("2 * 3 / 4", "\\frac{3}{2}")  # a symbolic answer goes to math-verify


def test_math_tool_teacher_skips_what_it_cannot_solve():
    assert math_tool.scripted_replies({"question": "Prove that there are infinitely many primes.", "answer": "x"}) == []
    assert math_tool.scripted_replies({"question": "What is 2 + 2?", "answer": "5"}) == []  # a wrong label
    assert solve_arith("What is __import__('os')?") is None


# ---------------------------------------------------------------------------------- react

ARITH = [  # (style, tools, every train task or a sample): the react styles x tools on the math data
    ("react", "calculator", False), ("react", "python", True), ("react", "calculator, python", False),
    ("react", "search", False), ("chat", "calculator", False), ("code", "python", True)]
SEARCH = [("react", "search", r) for r in ("qa_f1", "qa_em", "math")] + [("react", "search, calculator", "qa_f1")]


def react_env_kwargs(style, tools, reward="math"):
    kw = {"style": style, "tools": tools, "reward": reward}
    return tuple(sorted({**kw, "corpus": CORPUS}.items() if "search" in tools else kw.items()))


@pytest.mark.parametrize("style,tools,sandboxed", ARITH, ids=[f"{s}-{t}" for s, t, _ in ARITH])
def test_react_teacher_scores_the_maximum_on_math(style, tools, sandboxed):
    """configs/react_calculator.py's train tasks (the built-in route: max_tool_calls =
    max_refinement_iterations = 3) with each style / tools: every turn earns 1, no tool error; a
    tool is called once when there is one to compute with, else the agent works it out."""
    cfg, tasks = _train("react_calculator", react_env_kwargs(style, tools))
    assert len(tasks) == 1289
    make_env = workflow(cfg)[0]
    calls = 0 if style == "chat" or (style == "react" and tools == "search") else 1
    for t in sample(tasks, SANDBOX_SAMPLE) if sandboxed else tasks:
        env = make_env()
        replies = env.scripted_replies(t)
        assert replies == react.scripted_replies(t, **dict(react_env_kwargs(style, tools)))
        _, rew, m, obs = play(env, t, replies)
        assert rew == [1.0] * (calls + 1), (t, replies, obs)
        assert (m["team_reward"], m["tool_calls"], m["tool_errors"], m["no_answer"]) == (1.0, calls, 0, 0.0)
        assert [o.strip() for o in obs] == [f"Observation:\n{t['answer']}"] * calls
        if calls:  # the tool computes: the first reply holds the computation, no result
            assert numbers(replies[0]) <= numbers(t["question"])


def test_react_module_defaults_are_the_react_calculator_config(monkeypatch):
    """What sft.py calls today, scripted_replies(task), is the teacher of configs/react_calculator.py."""
    monkeypatch.chdir(ROOT)
    cfg, tasks = _train("react_calculator")
    env = workflow(cfg)[0]()
    assert (env.style, [x.name for x in env.tools], env.reward_name, env.max_calls) == (
        "react", ["calculator", "answer"], "math", 3)
    for t in tasks[:50]:
        assert react.scripted_replies(t) == env.scripted_replies(t)
        assert react.scripted_replies(t)[0].splitlines()[-1].startswith("Action: calculator[")


@pytest.mark.parametrize("style,tools,sandboxed", ARITH, ids=[f"{s}-{t}" for s, t, _ in ARITH])
def test_react_wrong_replies_score_less(style, tools, sandboxed):
    cfg, tasks = _train("react_calculator", react_env_kwargs(style, tools))
    make_env = workflow(cfg)[0]
    for t in sample(tasks, 5):
        env = make_env()
        _, rew, m, _ = play(env, t, env.scripted_replies(wrong_task(t)))
        assert set(rew) == {0.0} and m["team_reward"] == 0.0, t


@pytest.mark.parametrize("style,tools,reward", SEARCH, ids=[f"{t}-{r}" for _, t, r in SEARCH])
def test_react_teacher_scores_the_maximum_on_search(style, tools, reward):
    """ReAct + search on data/search_train.jsonl (every question): each search shows the supporting
    document the next thought cites, hop by hop, within the 3 calls; the answer scores 1."""
    cfg, tasks = _train("react_calculator", react_env_kwargs(style, tools, reward), search=True)
    assert len(tasks) == 78 and {t["hops"] for t in tasks} == {1, 2}
    make_env = workflow(cfg)[0]
    for t in tasks:
        env = make_env()
        replies = env.scripted_replies(t)
        assert replies == react.scripted_replies(t, **dict(react_env_kwargs(style, tools, reward)), max_tool_calls=3)
        _, rew, m, obs = play(env, t, replies)
        n = len(t["support"])
        assert rew == [1.0] * (n + 1) and (m["team_reward"], m["tool_calls"], m["tool_errors"]) == (1.0, n, 0), t
        assert all(f"[{doc}]" in o for doc, o in zip(t["support"], obs, strict=True)), (t, obs)
        assert replies[-1].endswith(f"\\boxed{{{t['answer']}}}")
    for t in tasks[:10]:  # another question's replies (same format, another answer) score 0
        # not an anagram of the answer: the math reward takes Zanne for Nezan (test_math_reward_tells_names_apart)
        u = next(x for x in tasks
                 if x["hops"] == t["hops"] and sorted(x["answer"].lower()) != sorted(t["answer"].lower()))
        env = make_env()
        _, rew, m, _ = play(env, t, env.scripted_replies(u))
        assert set(rew) == {0.0} and m["team_reward"] == 0.0


def test_math_reward_tells_names_apart():
    """math-verify reads a word as the product of its letters (Zanne = Z*a*n*n*e = Nezan): a text answer
    is compared as text, so an anagram earns nothing; algebra still goes to math-verify."""
    from rewards.math import math_reward
    assert math_reward("\\boxed{Zanne}", "Nezan") == 0.0 and math_reward("\\boxed{Nezan}", "Nezan") == 1.0
    assert math_reward("\\boxed{nezan}", "Nezan") == 1.0 and math_reward("\\boxed{New York}", "new york") == 1.0
    assert math_reward("\\boxed{2x+2}", "2(x+1)") == 1.0 and math_reward("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert math_reward("\\boxed{ne \\cdot Zan}", "Zanne") == 0.0 and math_reward("\\boxed{\\textit{Zanne}}", "Zanne") == 1.0
    assert math_reward("\\boxed{yx}", "xy") == 1.0 and math_reward("\\boxed{infinity}", "\\infty") == 1.0


def test_react_teacher_refuses_what_it_cannot_solve():
    """No search tool (or not ReAct) on a search question, a code task, an unreadable question, a
    tool budget too small for the hops: [] (sft.py's scripted teacher then skips the task)."""
    q = {"question": "What is the capital of the country where Driyr Lopa was born?", "answer": "Nezan",
         "support": ["person7", "city7_0", "country7"]}
    assert react.scripted_replies(q, tools="search", corpus=CORPUS)
    assert react.scripted_replies(q, tools="search", corpus=CORPUS, max_tool_calls=2) == []
    assert react.scripted_replies(q, tools="calculator") == []
    for style in ("chat", "code"):
        assert react.scripted_replies(q, style=style, tools="search", corpus=CORPUS) == []
    assert react.scripted_replies({**q, "answer": "Zanne"}, tools="search", corpus=CORPUS) == []  # docs disagree
    assert react.scripted_replies({"question": "Who wrote Hamlet?", "answer": "Shakespeare"}) == []
    assert react.scripted_replies({"question": "def f():", "answer": "x"}, style="code", tools="python",
                                  reward="code") == []


# ---------------------------------------------------------------------------------- sft.py end to end


def test_replies_fit_the_roles_max_tokens():
    """With SmolLM2's tokenizer (the configs' model; skipped where it is not cached), every teacher reply
    and its EOS fit the role's max_tokens: SFT data that RL's sampling would have cut short teaches a
    format the policy cannot finish."""
    from model import cache_dir
    where = cache_dir() / "smollm2-135m-instruct"
    if not (where / "tokenizer.json").is_file():
        pytest.skip(f"no SmolLM2 tokenizer in {where}")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)

    def longest(replies):
        return max(len(ids) + 1 for ids in tok(sorted(set(replies)), add_special_tokens=False)["input_ids"])
    cfg, tasks = _train("math_tool")
    limit = {r.name: r.max_tokens for r in cfg.roles}
    for i, role in enumerate(("analyzer", "executor", "verifier")):
        assert longest(math_tool.scripted_replies(t)[i] for t in tasks) <= limit[role], role
    cfg, tasks = _train("react_calculator")
    (agent,) = cfg.roles
    for style, tools, _ in ARITH:
        kw = dict(react_env_kwargs(style, tools))
        assert longest(r for t in tasks for r in react.scripted_replies(t, **kw)) <= agent.max_tokens, (style, tools)
    kw = dict(react_env_kwargs("react", "search", "qa_f1"))
    search = _train("react_calculator", tuple(sorted(kw.items())), True)[1]
    assert longest(r for t in search for r in react.scripted_replies(t, **kw)) <= agent.max_tokens


def test_sft_scripted_teacher_gives_every_roles_turns(tiny):
    """sft.scripted_teacher with the tiny model's tokenizer: math_tool gives analyzer, executor and
    verifier examples; react_calculator (the module's defaults, today's sft.py call) the agent's two
    turns; react + search through the env's own settings (the call sft.py would need for them)."""
    import sft
    _, tok = tiny
    n = 8
    cases = [("math_tool", (), False, math_tool, {"analyzer": n, "executor": n, "verifier": n}),
             ("react_calculator", (), False, react, {"agent": 2 * n})]
    kw = react_env_kwargs("react", "search", "qa_f1")
    cases.append(("react_calculator", kw, True,
                  types.SimpleNamespace(__name__="envs.react", scripted_replies=functools.partial(
                      react.scripted_replies, **dict(kw), max_tool_calls=3)), None))
    for name, env_kwargs, search, module, want in cases:
        cfg, tasks = _train(name, env_kwargs, search)
        make_env = workflow(cfg)[0]
        roles = {r.name for r in cfg.roles}
        examples, counts = sft.scripted_teacher(make_env, module, tasks, tok, {r: r for r in roles}, roles, n, 1.0)
        if want is None:  # search: one example per search and one for the answer
            want = {"agent": sum(len(t["support"]) + 1 for t in tasks[:n])}
        assert counts == {f"teacher:scripted/{r}": k for r, k in want.items()}, name
        assert {e.role for e in examples} == roles and all(e.reward == 1.0 for e in examples)
        for e in examples:
            sft.tokenize(e, tok)
            assert e.n_prompt > 0 and len(e.ids) > e.n_prompt and e.eos and e.source == "teacher:scripted"
            assert tok.decode(e.ids[e.n_prompt:], skip_special_tokens=True).strip() == e.reply.strip()
        replies = [e.reply for e in examples[:3]]
        if name == "math_tool":
            assert replies == math_tool.scripted_replies(tasks[0])
            assert "Execution output:\n" + tasks[0]["answer"] in examples[2].prompt  # the verifier saw the run
        elif not search:
            assert replies[:2] == react.scripted_replies(tasks[0]) and "Observation:" in examples[1].prompt

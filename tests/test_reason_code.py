"""The reasoner + coder team, until they agree (envs/reason_code.py) and its word problems (data/multistep_data.py):
the scripted teacher scores the maximum, rewards computed by hand, both roles handed out at once and each round
continuing each role's own chat, the sandbox really running the coder's code, hostile 1 MB replies, bad kwargs
as one line, reproducible disjoint splits, the tiny config training and the recipe's plan."""
import dataclasses
import json
from pathlib import Path

import pytest
from helpers import CountingEngine, bounded, play

import chat
from config import ConfigError, load_config_file
from data.multistep_data import KINDS, SIZES, run_steps, steps_program, write_splits
from envs import MIN_TIMEOUT, play_replies, prompts_of
from envs.reason_code import ReasonCodeEnv, aggregate, load_tasks, scripted_repair, scripted_replies

ROOT = Path(__file__).resolve().parent.parent
TASK = {"question": "Ana has 3 bags of 4 pens and loses 1. How many pens are left?", "answer": "11",
        "steps": ["pens = 3 * 4", "left = pens - 1"]}


def boxed(x) -> str:
    return f"I add it up.\n\\boxed{{{x}}}"


def code(body: str) -> str:
    return f"```python\n{body}\n```"


def test_the_teacher_scores_the_maximum_through_the_env():
    """scripted_replies on the first 250 training tasks (25 of each template): both right in round 1, they agree,
    the code ran; scripted_repair on 20 of them: the reasoner's slip paid 0, the coder 1, both right in round 2.
    A task without worked steps, or whose steps do not give its answer, has no lesson; nor one round."""
    tasks = load_tasks(str(ROOT / "data" / "multistep_train.jsonl"))[:250]
    assert {t["kind"] for t in tasks} == set(KINDS)
    for k, task in enumerate(tasks):
        roles, rewards, m, _ = play(ReasonCodeEnv(), task, scripted_replies(task))
        assert roles == ["reasoner", "coder"] and rewards == [1.0, 1.0], task
        assert (m["team_reward"], m["agreed"], m["rounds"], m["code_ran"]) == (1.0, 1.0, 1.0, 1.0), task
        if k < 20:
            roles, rewards, m, _ = play(ReasonCodeEnv(), task, scripted_repair(task))
            assert roles == ["reasoner", "coder"] * 2 and rewards == [0.0, 1.0, 1.0, 1.0], task
            assert (m["team_reward"], m["rounds"], m["reasoner_correct"], m["coder_correct"]) == (1.0, 2.0, 1.0, 1.0)
    for bad in ({**TASK, "steps": None}, {**TASK, "answer": "12"}, {**TASK, "steps": ["pens = 3 / 4"]}):
        assert scripted_replies(bad) == [] and scripted_repair(bad) is None
    assert ReasonCodeEnv(max_rounds=1).scripted_repair(TASK) is None and ReasonCodeEnv().scripted_repair(TASK)


def test_sft_scripted_teacher_teaches_both_roles_and_never_the_slip(tiny):
    """sft.py's scripted teacher on this workflow: both roles' turns of the perfect round and of the repair's
    second round are examples; the reasoner's slip (the repair's first turn) is not."""
    from sft_teachers import scripted_teacher
    import envs.reason_code as module
    _, tok = tiny
    tasks = load_tasks(str(ROOT / "data" / "multistep_train.jsonl"))[:4]
    out, counts = scripted_teacher(ReasonCodeEnv, module, tasks, tok, {"reasoner": "reasoner", "coder": "coder"},
                                   {"reasoner", "coder"}, 0, 0.7)
    assert counts == {"teacher:scripted/reasoner": 4, "teacher:scripted/coder": 4, "teacher:mistake/reasoner": 4,
                      "teacher:repair/coder": 8, "teacher:repair/reasoner": 4}
    slips = {scripted_repair(t)[0] for t in tasks}
    assert not [e for e in out if e.reply in slips] and len(out) == 20


def test_rewards_of_a_disagreement_then_an_agreement_computed_by_hand():
    """Round 1: the reasoner says 10, the coder prints 11 (right): 0 and 1. Round 2 both 11 (the coder prints 11.0:
    the same number): 1 + agree_bonus each, and the episode ends there with the team right."""
    replies = [boxed(10), code("print(3 * 4 - 1)"), boxed(11), code("print(11.0)")]
    for bonus in (0.0, 0.5):
        roles, rewards, m, _ = play(ReasonCodeEnv(agree_bonus=bonus), TASK, replies)
        assert rewards == [0.0, 1.0, 1.0 + bonus, 1.0 + bonus]
        assert m == {"team_reward": 1.0, "agreed": 1.0, "rounds": 2.0, "reasoner_correct": 1.0, "coder_correct": 1.0,
                     "reasoner_alone": 0.0, "coder_alone": 1.0, "code_ran": 1.0}
    # agreeing on a wrong answer: the bonus, and the team is wrong
    _, rewards, m, _ = play(ReasonCodeEnv(agree_bonus=0.25), TASK, [boxed(12), code("print(12)")])
    assert rewards == [0.25, 0.25] and (m["team_reward"], m["agreed"]) == (0.0, 1.0)


def test_max_rounds_ends_a_disagreement_and_the_team_takes_the_reasoners_answer():
    """Never agreeing: max_rounds rounds; the team reward is the reasoner's last answer's (right here, the coder
    wrong; and the other way round, wrong)."""
    for rounds in (1, 3):
        _, rewards, m, _ = play(ReasonCodeEnv(max_rounds=rounds), TASK, [boxed(11), code("print(7)")] * rounds)
        assert rewards == [1.0, 0.0] * rounds and (m["rounds"], m["agreed"], m["team_reward"]) == (rounds, 0.0, 1.0)
    env = ReasonCodeEnv(max_rounds=2)
    _, _, m, _ = play(env, TASK, [boxed(7), code("print(11)")] * 2)
    assert (m["team_reward"], m["coder_correct"], m["reasoner_correct"]) == (0.0, 1.0, 0.0) and env.final_answer() == "7"
    # the round-1 answers, not the last round's: the reasoner right only in round 1, the coder only in round 2
    _, _, m, _ = play(ReasonCodeEnv(max_rounds=2), TASK, [boxed(11), code("print(7)"), boxed(7), code("print(11)")])
    assert (m["reasoner_alone"], m["coder_alone"], m["reasoner_correct"], m["coder_correct"]) == (1.0, 0.0, 0.0, 1.0)
    eps = [type("E", (), {"metrics": mm, "samples": []}) for mm in (m, {"env_error": 1.0},
           {"agreed": 1.0, "rounds": 1.0, "team_reward": 1.0}, {"agreed": 1.0, "rounds": 2.0, "team_reward": 0.0})]
    assert aggregate(eps) == {"first_round_agreed": 1 / 3, "agree_precision": 0.5}


def test_both_roles_are_handed_out_at_once_and_a_round_continues_each_roles_own_chat():
    """reset hands out [reasoner, coder]; after a disagreement the next round's two prompts are each role's last
    messages + its reply verbatim + a message with the other's answer and the coder's output."""
    env = ReasonCodeEnv()
    first = env.reset(TASK)
    assert isinstance(first, list) and [p.role for p in first] == ["reasoner", "coder"]
    said = [boxed(10), code("x = 3 * 4 - 1\nprint('total:')\nprint(x)")]
    second = env.step(said)
    assert isinstance(second, list) and [p.role for p in second] == ["reasoner", "coder"]
    for before, reply, after in zip(first, said, second):
        assert chat.continues(before.messages, reply, after.messages)
    assert "The coder's answer: 11. Yours: 10." in second[0].messages[-1]["content"]
    assert "total:\n11" in second[0].messages[-1]["content"]  # the coder's output
    assert "The reasoner's answer: 10. Yours: 11." in second[1].messages[-1]["content"]
    third = env.step([boxed(12), code("print(13)")])
    for before, reply, after in zip(second, [boxed(12), code("print(13)")], third):
        assert chat.continues(before.messages, reply, after.messages)


def test_the_driver_generates_both_roles_in_one_engine_call_a_round(tiny):
    """Through rollout.run_episodes on the tiny model: one engine call a round with both adapters, and each second
    round's prompt ids extend that role's first turn (prompt + sampled ids) token for token."""
    import lora
    from rollout import RoleSpec, SamplingParams, TorchEngine, run_episodes
    m, tok = tiny
    lora.add_lora(m, ["reasoner", "coder"], rank=4, alpha=8)
    eng = CountingEngine(TorchEngine(m, tok))
    roles = {r: RoleSpec(r, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)) for r in ("reasoner", "coder")}
    samples, eps = run_episodes(eng, tok, lambda: ReasonCodeEnv(max_rounds=2), [TASK], roles, num_chains=2, max_turns=4)
    assert eng.calls == [["reasoner", "coder"] * 2] * 2  # 2 chains x 2 roles, in 2 rounds
    for e in eps:
        by_role = {r: [s for s in e.samples if s.role == r] for r in ("reasoner", "coder")}
        for first, second in by_role.values():
            assert second.prompt_ids[:len(first.prompt_ids) + len(first.completion_ids)] == \
                first.prompt_ids + first.completion_ids


def test_the_sandbox_runs_the_coders_code():
    """What is paid is what the program prints last, not what the reply says: a comment claiming 11 that prints 13
    is paid 0; a crash after printing 11, or no fenced block, gives no answer; code_timeout is the run's limit."""
    cases = [(code("# the answer is 11\nprint(13)"), 0.0, 1.0), (code("print(11)\nraise SystemExit(1)"), 0.0, 0.0),
             ("print(11)", 0.0, 0.0), (code("print(11)\nprint()"), 1.0, 1.0), (code("import math\nprint(math.isqrt(121))"), 1.0, 1.0)]
    for reply, paid, ran in cases:
        _, rewards, m, _ = play(ReasonCodeEnv(max_rounds=1), TASK, [boxed(7), reply])
        assert (rewards[1], m["code_ran"]) == (paid, ran), reply
    slow = code("import time\ntime.sleep(2)\nprint(11)")
    for timeout, paid in ((MIN_TIMEOUT, 0.0), (20, 1.0)):
        _, rewards, _, _ = play(ReasonCodeEnv(max_rounds=1, code_timeout=timeout), TASK, [boxed(7), slow])
        assert rewards[1] == paid, timeout


MB = 2 ** 20


@pytest.mark.parametrize("shape", ["```python\n + spaces", "\\boxed{ repeated", "``` repeated", "print( repeated",
                                   "digits in a box", "a program printing 1 MB"])
def test_1mb_hostile_replies_finish_within_a_cpu_budget(shape):
    """Each 1 MB reply as both roles' turns of every round: every step within 5 s of this process's CPU (a sandbox
    run it waits for is not counted), and what the next round shows of it stays short."""
    text = {"```python\n + spaces": lambda: "```python\n" + " " * MB, "\\boxed{ repeated": lambda: "\\boxed{" * (MB // 7),
            "``` repeated": lambda: "```" * (MB // 3), "print( repeated": lambda: "print(" * (MB // 6),
            "digits in a box": lambda: "\\boxed{" + "7" * MB + "}",
            "a program printing 1 MB": lambda: code("print('9' * 2**20)\nprint('8' * 2**20)")}[shape]()
    env = ReasonCodeEnv(max_rounds=2)
    handed = env.reset(TASK)
    while prompts_of(handed):
        with bounded(5, shape):
            handed = env.step([text, text])
        for p in prompts_of(handed):
            assert len(p.messages[-1]["content"]) < 1500
    assert len(env.turn_rewards()) == 2 * env.metrics()["rounds"]


@pytest.mark.parametrize("kw, field", [
    ({"max_rounds": 0}, r"max_rounds: must be an integer in \[1, 16\], got 0"), ({"max_rounds": 2.0}, "max_rounds"),
    ({"max_rounds": True}, "max_rounds"), ({"agree_bonus": -1}, "agree_bonus"),
    ({"agree_bonus": float("nan")}, "agree_bonus"), ({"code_timeout": 0.5}, r"code_timeout: must be a number in \[1, 600\]"),
    ({"code_timeout": "5"}, "code_timeout"), ({"no_such": 1}, "no_such"),
])
def test_bad_env_kwargs_are_one_config_error_line(kw, field):
    from workflows import check_roles
    cfg = load_config_file(str(ROOT / "configs" / "tiny_reason_code.py"))
    with pytest.raises(ConfigError, match=field) as e:
        check_roles(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs=kw)))
    assert "\n" not in str(e.value)


def test_check_config_refuses_merged_rounds_and_too_few_turns():
    """Rounds are paid apart: merge_turns is refused with max_rounds > 1 (not with one round); rollout.max_turns
    must hold max_rounds rounds of two turns."""
    from workflows import check_roles
    cfg = load_config_file(str(ROOT / "configs" / "tiny_reason_code.py"))
    check_roles(cfg)
    R = dataclasses.replace
    merged = R(cfg, rollout=R(cfg.rollout, merge_turns=True))
    with pytest.raises(ConfigError, match=r"config field rollout.merge_turns: max_rounds=2: .*paid apart"):
        check_roles(merged)
    check_roles(R(merged, data=R(cfg.data, env_kwargs={"max_rounds": 1})))
    with pytest.raises(ConfigError, match=r"config field rollout.max_turns: 4 cuts .* need 6"):
        check_roles(R(cfg, data=R(cfg.data, env_kwargs={"max_rounds": 3})))


def test_the_generators_splits_are_disjoint_and_reproducible(tmp_path):
    """`python data/multistep_data.py` writes the shipped files byte for byte (seed 0); no question is in two splits;
    every row's steps give its answer (a whole number >= 0) and use several steps; every template is in every
    split; another seed gives another test split (most questions new: a template's small numbers may repeat)."""
    paths = write_splits(tmp_path)
    rows = {}
    for split, p in paths.items():
        assert p.read_bytes() == (ROOT / "data" / p.name).read_bytes(), split
        rows[split] = [json.loads(x) for x in p.read_text().splitlines()]
        assert len(rows[split]) == SIZES[split] and {r["kind"] for r in rows[split]} == set(KINDS)
        for r in rows[split]:
            assert str(run_steps(r["steps"])[-1][1]) == r["answer"] and int(r["answer"]) >= 0 and len(r["steps"]) >= 3
    qs = {s: {r["question"] for r in rs} for s, rs in rows.items()}
    assert sum(map(len, qs.values())) == len(set().union(*qs.values())) == sum(SIZES.values())
    (tmp_path / "seed1").mkdir()
    other = write_splits(tmp_path / "seed1", seed=1)
    shared = {json.loads(x)["question"] for x in other["test"].read_text().splitlines()} & qs["test"]
    assert len(shared) < SIZES["test"] // 2, len(shared)


def test_the_tiny_config_trains_a_step(tmp_path):
    """configs/tiny_reason_code.py trains 1 step and validates through train.main: both roles rewarded, the env's
    metrics and aggregate logged."""
    import train
    cfg = load_config_file(str(ROOT / "configs" / "tiny_reason_code.py"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=1, test_freq=1,
                                                               output_dir=str(tmp_path / "run")))
    m = train.main(cfg)
    assert "train/reward/reasoner" in m and "train/reward/coder" in m
    assert {"val/team_reward", "val/agreed", "val/rounds", "val/code_ran", "train/tokens/coder"} <= set(m)


def test_the_recipe_plans_both_roles_from_their_sft_with_agent_and_turn_groups(tmp_path):
    """configs/cpu/reason_code.py: a recipe (recipes.py finds it); RL starts every role from its SFT adapter, the
    teacher is the scripted team, groups are per role and turn, val is the val split."""
    import recipes
    assert "reason_code" in recipes.recipes()
    _, cfg, sft = recipes.load_recipe("reason_code")
    stages = dict(recipes.plan("reason_code", tmp_path, cfg, sft, tiny=False))
    assert [f"--roles.{i}.init-from" in stages["rl"] for i in range(len(cfg.roles))] == [True, True]
    assert "scripted" in stages["sft"] and cfg.algo.group_by_turn and cfg.data.val_files == "data/multistep_val.jsonl"
    assert cfg.rollout.max_turns == 2 * cfg.data.env_kwargs["max_rounds"] and not cfg.rollout.merge_turns


@pytest.mark.parametrize("style", ["code", "react"])
def test_the_one_agent_baselines_teacher_runs_the_worked_solution_in_the_sandbox(style):
    """envs/react.py's teacher on a multi-step problem: one program (a ```python block, or the python tool) that the
    env runs in the sandbox, then the boxed answer; played through the env it earns 1 and final_answer() is the
    answer (eval.py's vote); a wrong worked solution gives no lesson."""
    from envs.react import ToolAgentEnv, scripted_replies as react_script
    tasks = [json.loads(x) for x in (ROOT / "data" / "multistep_train.jsonl").read_text().splitlines()[:50]]
    assert {t["kind"] for t in tasks} == set(KINDS)
    for task in tasks:  # every template
        env = ToolAgentEnv(style=style, tools=("python",), max_tool_calls=7)
        assert play_replies(env, task, react_script(task, style=style, tools="python")) and env.reward() == 1.0, task
    task = tasks[0]
    replies = react_script(task, style=style, tools="python")
    env = ToolAgentEnv(style=style, tools=("python",), max_tool_calls=7)
    assert play_replies(env, task, replies) and env.reward() == 1.0 and env.final_answer() == task["answer"]
    assert env.calls == 1 and [c.strip() for c in env.codes] == \
        [steps_program(task["steps"]).replace("\n", "; " if style == "react" else "\n")]
    assert react_script({**task, "answer": str(int(task["answer"]) + 1)}, style=style, tools="python") == []
    assert react_script(task, style="react", tools="calculator") == []  # no python to run it in


def test_the_one_agent_baseline_has_the_teams_turns_tokens_data_and_schedule():
    """configs/cpu/reason_code_single.py: the team's turn budget (8) and cap on generated tokens per task (8 x 128 =
    4 rounds x (160 + 96)), the same train/val data, SFT, RL steps, batch, chains and groups; the sandboxed python."""
    import recipes
    _, team, tsft = recipes.load_recipe("reason_code")
    _, one, osft = recipes.load_recipe("reason_code_single")
    assert one.rollout.max_turns == team.rollout.max_turns == 8 and one.data.env_kwargs["max_tool_calls"] == 7
    assert one.rollout.max_turns * one.roles[0].max_tokens == \
        team.data.env_kwargs["max_rounds"] * sum(r.max_tokens for r in team.roles)
    assert (one.data.env, one.data.env_kwargs["tools"], one.data.env_kwargs["style"]) == ("react", "python", "code")
    same = lambda c: (c.data.train_files, c.data.val_files, c.data.batch_size, c.data.val_size, c.trainer.total_steps,
                      c.rollout.num_chains, c.algo, c.lora, c.model)
    assert same(one) == same(team) and osft == {**tsft, "teacher_tasks": osft["teacher_tasks"]}


def test_the_one_agent_baseline_is_taught_as_many_programs_as_the_teams_coder(tiny):
    """(i)'s SFT is matched to the coder's by programs, not tasks: the two recipes' scripted teachers, run as sft.py
    runs them (workflow, training tasks, the default min_reward 0.7) on their teacher_tasks, give (i)'s agent at
    least as many code turns as the team's coder (96 = 32 tasks x 3: the perfect round and both repair rounds).
    Matched by tasks (the same teacher_tasks) it had a third of them."""
    import recipes
    from sft_teachers import scripted_teacher
    from workflows import load_data, workflow
    _, tok = tiny
    programs = {}
    for name in ("reason_code", "reason_code_single"):
        _, cfg, sft = recipes.load_recipe(name)
        make_env, module, _ = workflow(cfg)
        names = {r.name for r in cfg.roles}
        ex, _ = scripted_teacher(make_env, module, load_data(cfg)[0], tok, {n: n for n in names}, names,
                                 sft["teacher_tasks"], 0.7)
        programs[name] = sum("```python" in e.reply for e in ex if e.role in ("coder", "agent"))
        if name == "reason_code":
            assert programs[name] == sum(e.role == "coder" for e in ex)
    assert programs["reason_code"] == 96 and programs["reason_code_single"] >= programs["reason_code"], programs

"""The SWE team's scripted perfect teacher (envs/swe.py scripted_replies): played through SWETeamEnv
with configs/swe_team.py's env kwargs it earns every turn's maximum (1) and team reward 1 on a
deterministic sample of the train instances (each runs the validator's snippet and the scorer's
tests in the sandbox: ~0.5-0.9 s a task on 2 busy cores, so the suite plays 32 of the 195; all 195
reach the maximum, measured once outside the suite); a wrong edit scores less; the turn count
follows the tool-call budgets; sft.py's scripted_teacher turns its turns into examples for every role."""
import json
import os
import time

import pytest

from config import load_config_file
from envs.swe import SWETeamEnv, _file_edits, apply_edits, load_tasks, parse_edits, parse_verdict, scripted_replies
from runtime.tools import parse_tool_call

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = load_config_file(os.path.join(ROOT, "configs", "swe_team.py"))
KW = dict(CFG.data.env_kwargs)
ROLES = ("analyzer", "writer", "validator")
SAMPLE = 32  # train instances played for the maximum: the first of each bug kind, then every 6th


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(os.path.join(ROOT, "data", "swe_train.jsonl"))


def play(task, replies, **kw):
    env = SWETeamEnv(**{**KW, **kw})
    turn, roles = env.reset(task), []
    for r in replies:
        assert turn is not None, f"{task['instance_id']}: ended before {r[:60]!r}"
        roles.append(turn.role)
        turn = env.step(r)
    assert turn is None, f"{task['instance_id']}: did not end"
    return env, roles, env.turn_rewards(), env.metrics()


def test_the_teacher_scores_the_maximum_on_a_sample_of_train_tasks(tasks):
    firsts = {t["bug_kind"]: t for t in reversed(tasks)}
    sample = list(firsts.values()) + [t for t in tasks[::6] if t not in firsts.values()][:SAMPLE - len(firsts)]
    kinds = {"off_by_one", "wrong_operator", "swapped_arguments", "missing_edge_case"}
    assert len(sample) == SAMPLE and {t["bug_kind"] for t in sample} == kinds
    t0 = time.time()
    for task in sample:
        replies = scripted_replies(task)  # the defaults are configs/swe_team.py's budgets
        env, roles, rewards, m = play(task, replies)
        # two analyzer tool calls, the diagnosis, the edit, one validator tool call, the verdict
        assert roles == ["analyzer"] * 3 + ["writer"] + ["validator"] * 2, task["instance_id"]
        assert rewards == [1.0] * len(replies), (task["instance_id"], rewards)
        assert (m["team_reward"], m["resolved"], m["files_localised"], m["iterations"], m["accepted"],
                m["validator_correct"], m["analyzer_calls"]) == (1.0, 1.0, 1.0, 1, 1.0, 1.0, 2), task["instance_id"]
        # every tool call was read and answered (no error observation), and the analyzer read the bug's lines
        obs = [text for who, text, _ in env.history if who == "observation"]
        assert len(obs) == 3 and not any(o.startswith("error") for o in obs), (task["instance_id"], obs)
        bug = parse_edits(replies[3])[0][0].search.split("\n")
        assert any(ln.strip() and ln in obs[1] for ln in bug), (task["instance_id"], obs[1])
        assert env.named_files() == set(env.gold) and env.model_patch() == task["patch"]
    per_task = (time.time() - t0) / len(sample)
    print(f"\n{len(sample)} train tasks at the maximum, {per_task:.2f} s a task")


def test_a_wrong_edit_scores_less(tasks):
    for task in (tasks[0], tasks[len(tasks) // 2]):
        replies = scripted_replies(task)
        good = sum(play(task, replies)[2])
        edit = parse_edits(replies[3])[0][0]
        keep = f"{edit.path}\n<<<<<<< SEARCH\n{edit.search}\n=======\n{edit.search}\n>>>>>>> REPLACE"  # the bug itself
        noted = f"{edit.path}\n<<<<<<< SEARCH\n{edit.search}\n=======\n{edit.search}  # fixed\n>>>>>>> REPLACE"
        for wrong in (keep, noted):
            _, _, rewards, m = play(task, replies[:3] + [wrong] + replies[4:])
            assert rewards[:3] == [1.0] * 3 and rewards[3:] == [0.0] * 3 and m["team_reward"] == 0.0, rewards
            assert sum(rewards) < good
        assert m["patch_applied"] == 1.0  # the comment applied and fixed nothing; the validator accepted it: 0


def test_the_turns_follow_the_tool_budgets(tasks):
    task = tasks[1]
    for kw, n_a, n_v in (({"max_analyzer_calls": 0, "max_validator_calls": 0}, 0, 0),  # configs/tiny_swe.py's
                         ({"max_analyzer_calls": 4, "max_validator_calls": 2}, 2, 2),  # the env's defaults
                         ({"max_analyzer_calls": 1, "max_validator_calls": 1}, 1, 1)):
        replies = scripted_replies(task, **kw)
        _, roles, rewards, m = play(task, replies, **kw)
        assert roles == ["analyzer"] * (n_a + 1) + ["writer"] + ["validator"] * (n_v + 1), kw
        assert rewards == [1.0] * len(replies) and m["team_reward"] == 1.0, (kw, rewards)
    tools = SWETeamEnv()._tools
    assert [parse_tool_call(r, tools("analyzer")).name for r in replies[:1]] == ["grep"]
    replies = scripted_replies(task, max_analyzer_calls=4, max_validator_calls=2)
    assert [parse_tool_call(r, tools("analyzer")).name for r in replies[:2]] == ["grep", "read_file"]
    assert [parse_tool_call(r, tools("validator")).name for r in replies[-3:-1]] == ["python", "run_tests"]
    assert parse_verdict(replies[-1]) is True


def test_edit_blocks_take_the_least_context_that_is_unique():
    text = "def f(x):\n    y = x + 1\n    return y\n\n\ndef g(x):\n    y = x + 1\n    return y * 2\n"
    for fixed in (text.replace("return y * 2", "return y * 3"),  # unique: the line alone
                  text.replace("    return y * 2", "    y = y - 1\n    return y * 2"),  # an insertion needs a line
                  text.replace("def g(x):\n    y = x + 1", "def g(x):\n    y = x - 1"),  # twice in the file: context
                  text.replace("x + 1", "x + 2")):  # two changes, each its own block
        blocks = _file_edits(text, fixed)
        edits = parse_edits("\n\n".join(f"m.py\n<<<<<<< SEARCH\n{s}\n=======\n{r}\n>>>>>>> REPLACE"
                                        for s, r in blocks))[0]
        assert apply_edits({"m.py": text}, edits, set()) == ({"m.py": fixed}, [])
    assert _file_edits(text, text.replace("return y * 2", "return y * 3")) == [("    return y * 2", "    return y * 3")]
    assert _file_edits(text, text.replace("def g(x):\n    y = x + 1", "def g(x):\n    y = x - 1")) == [
        ("def g(x):\n    y = x + 1", "def g(x):\n    y = x - 1")]
    assert len(_file_edits(text, text.replace("x + 1", "x + 2"))) == 2
    spaced = text.replace("return y * 2", "return y * 2  ")  # trailing blanks the writer's view may not show
    assert _file_edits(spaced, spaced.replace("y * 2", "y * 3")) == [("    return y * 2", "    return y * 3")]


def test_sft_scripted_teacher_gives_examples_for_every_role(tiny, tasks):
    import sft
    from workflows import workflow
    _, tok = tiny
    make_env, module, _ = workflow(CFG)
    ex, counts = sft.scripted_teacher(make_env, module, tasks, tok, {r: r for r in ROLES}, set(ROLES), 2, 1.0)
    assert counts == {"teacher:scripted/analyzer": 6, "teacher:scripted/writer": 2, "teacher:scripted/validator": 4}
    assert {e.role for e in ex} == set(ROLES) and all(e.reward == 1.0 for e in ex)
    writer = next(e for e in ex if e.role == "writer")
    assert "<<<<<<< SEARCH" in writer.reply and "Current contents:" in writer.prompt
    want = tok.apply_chat_template(_writer_prompt(tasks[0]), add_generation_prompt=True, tokenize=False)
    assert writer.prompt == want
    assert json.loads(ex[0].reply.removeprefix("<tool_call>").removesuffix("</tool_call>"))["name"] == "grep"


def _writer_prompt(task):
    env = SWETeamEnv(**KW)
    turn = env.reset(task)
    for r in scripted_replies(task):
        if turn.role == "writer":
            return turn.messages
        turn = env.step(r)
    raise AssertionError("no writer turn")


def test_tool_rounds_extend_one_another_and_pack(tiny, tasks):
    """The analyzer's tool rounds, and the validator's on one patch, continue one conversation: each
    round's prompt (through the chat template) starts with the last round's prompt + reply, token for
    token, the tools stay in the system prompt after the last call, so the update packs a role's
    rounds into one row (2 tool calls + diagnosis: 3 turns -> 1 row; call + verdict: 2 -> 1)."""
    import learner
    from chat import chat_ids as _chat_ids
    from rollout import Sample
    _, tok = tiny
    task = tasks[0]
    env, steps = SWETeamEnv(**KW), []
    turn = env.reset(task)
    for r in scripted_replies(task):
        c = tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]
        steps.append(Sample(0, 0, turn.role, len(steps), _chat_ids(tok, turn.messages), c, [-1.0] * len(c)))
        turn = env.step(r)
    assert turn is None and [s.role for s in steps] == ["analyzer"] * 3 + ["writer"] + ["validator"] * 2
    for a, b in [(0, 1), (1, 2), (4, 5)]:
        full = steps[a].prompt_ids + steps[a].completion_ids
        assert steps[b].prompt_ids[:len(full)] == full, (a, b)
    assert "No more tool calls" in tok.decode(steps[2].prompt_ids[len(steps[1].prompt_ids):])  # the last round's ask
    for role, n in [("analyzer", 3), ("validator", 2)]:
        ss = [s for s in steps if s.role == role]
        pk = learner.Packed(learner.AdapterBatch(ss, [1.0] * n, tok.pad_token_id, 64))
        assert (len(ss), len(pk.batch.samples)) == (n, 1), role


def test_a_hand_made_instance_without_generator_fields():
    """No bug_kind, an issue without a ```python example (the validator runs the module's tests), a
    bug line that occurs twice in the file (the edit takes context), inside a method."""
    from envs.swe import make_patch
    buggy = ("class Calc:\n    def add(self, a, b):\n        return a - b\n\n    def sub(self, a, b):\n"
             "        return a - b\n")
    base = {"calc/__init__.py": "from .ops import Calc\n", "calc/ops.py": buggy, "calc/util.py": "X = 1\n",
            "tests/test_ops.py": "from calc.ops import Calc\n\n\ndef test_sub():\n    assert Calc().sub(5, 2) == 3\n"}
    fixed = {**base, "calc/ops.py": buggy.replace("add(self, a, b):\n        return a - b",
                                                  "add(self, a, b):\n        return a + b")}
    with_tests = {**base, "tests/test_ops.py": base["tests/test_ops.py"]
                  + "\n\ndef test_add():\n    assert Calc().add(2, 3) == 5\n"}
    task = {"instance_id": "calc-2", "repo": "me/calc", "base_commit": "0" * 40, "repo_files": base,
            "problem_statement": "Calc.add(2, 3) returns -1; it should add.", "patch": make_patch(base, fixed),
            "test_patch": make_patch(base, with_tests), "FAIL_TO_PASS": ["tests/test_ops.py::test_add"],
            "PASS_TO_PASS": ["tests/test_ops.py::test_sub"]}
    replies = scripted_replies(task, max_analyzer_calls=2, max_validator_calls=2)
    assert '"def add("' in replies[0] and "`add` in calc/ops.py: line 3" in replies[2]
    assert "    def add(self, a, b):\n        return a - b\n=======" in replies[3]
    assert '"run_tests"' in replies[4] and len(replies) == 6  # no example in the issue: one check
    _, roles, rewards, m = play(task, replies, max_analyzer_calls=2, max_validator_calls=2)
    assert roles == ["analyzer"] * 3 + ["writer"] + ["validator"] * 2
    assert rewards == [1.0] * 6 and m["team_reward"] == 1.0


def test_sft_plays_each_envs_own_budgets_tiny_swe_included(tiny):
    """sft.py prefers the env's own scripted_replies: configs/tiny_swe.py (no tool calls) gets its own play."""
    import sft
    from config import load_config_file
    from workflows import load_data, workflow
    _, tok = tiny
    cfg = load_config_file("configs/tiny_swe.py")
    make_env, module, _ = workflow(cfg)
    tasks = load_data(cfg)[0][:2]
    roles = [r.name for r in cfg.roles]
    ex, counts = sft.scripted_teacher(make_env, module, tasks, tok, {r: r for r in roles}, set(roles), 0, 0.7)
    assert {e.role for e in ex} == set(roles) and all(e.reward == 1.0 for e in ex), counts
    assert not any(k.startswith("teacher:below_min_reward") for k in counts), counts

"""compare.py: the README's arm table, recomputed from trajectory files by replaying the run's own env."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import compare
import trajectories
from config import load_config_file, to_dict
from envs.math_3agent import MathTeamEnv

Q = {"question": "What is 3 + 4?", "answer": "7"}
ROOT = Path(__file__).resolve().parent.parent


def record(step, replies, task=Q, task_id=0):
    """The trajectory record train.py would write for this scripted episode (rewards from the env)."""
    env = MathTeamEnv(max_refinement_iterations=1)
    turn, roles = env.reset(task), []
    for r in replies:
        roles.append(turn.role)
        turn = env.step(r)
    turns = [{"turn": i, "role": ro, "prompt": "", "reply": r, "reward": w, "reply_tokens": 10 * (i + 1)}
             for i, (ro, r, w) in enumerate(zip(roles, replies, env.turn_rewards()))]
    return {"split": "val", "step": step, "task_id": task_id, "episode_id": task_id, "task": task,
            "metrics": env.metrics(), "turns": turns}


EPISODES = [  # (solution right?, verdict) -> what each episode exercises
    ["\\boxed{7}", "Verdict: Correct"],  # tp
    ["\\boxed{7}", "Verdict: Incorrect", "\\boxed{8}", "Verdict: Incorrect"],  # fn, then a break, tn
    ["\\boxed{6}", "Verdict: Incorrect", "\\boxed{7}", "Verdict: Correct"],  # tn, a fix, tp
    ["\\boxed{6}", "Verdict: Correct"],  # fp
    ["\\boxed{6}", "no verdict", "\\boxed{5}", "Verdict: Correct"],  # unparsed on wrong, fp
]


@pytest.fixture
def run(tmp_path):
    cfg = load_config_file("configs/tiny_math_3agent.py")
    ck = tmp_path / "checkpoints" / "step_000002"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text(json.dumps(to_dict(cfg)))
    trajectories.write(tmp_path / "trajectories" / "val_step_000000.jsonl", [record(0, EPISODES[0])] * 5)
    trajectories.write(tmp_path / "trajectories" / "val_step_000002.jsonl", [record(2, e) for e in EPISODES])
    rows = [{"step": 0}, {"step": 1, "time/step": 30.0}, {"step": 2, "time/step": 90.0}, {"step": 3, "time/step": 5.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_table_is_hand_computed(run, capsys):
    (row,) = compare.main([str(run), "--plot", str(run / "c.png")])
    assert row["step"] == 2 and row["n"] == 5 and row["wall"] == 120.0
    assert row["team"] == pytest.approx(2 / 5) and row["team_sd"] == pytest.approx((0.4 * 0.6 / 5) ** 0.5)
    a = row["aggregate"]
    # verdicts on correct solutions: tp, fn, tp -> 2/3; on wrong ones: tn(8), tn(6), fp, unparsed, fp -> 2/5
    assert a["evaluator_balanced_acc"] == pytest.approx((2 / 3 + 2 / 5) / 2)
    assert a["refine_success"] == pytest.approx(1 / 2) and a["refine_break_rate"] == 1.0
    assert row["counts"] == {"initial_correct": 2, "refine_fixed": 1, "refine_broken": 1}
    assert [(s, t) for s, _, t in row["curve"]] == [(0, 1.0), (2, 0.4)]
    # generated tokens per task: 10 + 20 (two turns) in two episodes, 10 + 20 + 30 + 40 in three -> 150 / 5 = 30
    assert row["tokens"] == pytest.approx((2 * 30 + 3 * 100) / 5) and row["generations"] == pytest.approx(16 / 5)
    assert "0.400 ± 0.219" in capsys.readouterr().out and (run / "c.png").stat().st_size > 0
    assert compare.main([str(run), "--step", "0"])[0]["team"] == 1.0


def test_a_reward_the_env_does_not_give_is_an_error(run):
    f = run / "trajectories" / "val_step_000002.jsonl"
    recs = trajectories.read(f)
    recs[3]["turns"][1]["reward"] = 1.0  # the fp verdict recorded as right
    trajectories.write(f, recs)
    with pytest.raises(SystemExit, match="val_step_000002.jsonl:4: task 0 turn 1 .evaluator_critique. replays to reward -1"):
        compare.main([str(run)])


def test_an_episode_that_replays_to_fewer_turns_or_another_team_reward_is_an_error(run):
    """A recorded episode whose env now ends sooner (a turn left unplayed, its reward never compared) or pays the
    team otherwise is the env changed since the run, as a turn's reward is: one line, not metrics of another game."""
    f = run / "trajectories" / "val_step_000002.jsonl"
    recs = trajectories.read(f)
    recs[0]["turns"].append({**recs[0]["turns"][1], "turn": 2})  # a turn the env (it ended at turn 1) never plays
    trajectories.write(f, recs)
    with pytest.raises(SystemExit, match="val_step_000002.jsonl:1: task 0 replays to 2 turns, recorded 3"):
        compare.main([str(run)])
    recs = [record(2, e) for e in EPISODES]
    recs[2]["metrics"]["team_reward"] = 0.0  # the fixed answer recorded as a loss
    trajectories.write(f, recs)
    with pytest.raises(SystemExit, match="val_step_000002.jsonl:3: task 0 replays to team_reward 1.0, recorded 0.0"):
        compare.main([str(run)])


def test_missing_step_and_non_run_are_clear(run, tmp_path):
    with pytest.raises(SystemExit, match="no eval at step 5"):
        compare.main([str(run), "--step", "5"])
    with pytest.raises(SystemExit, match="neither config.json nor checkpoints"):
        compare.main([str(tmp_path / "trajectories")])


def test_mcnemar_and_paired_se_by_hand():
    assert compare.mcnemar_exact(5, 1) == pytest.approx(2 * (1 + 6) / 64)
    assert compare.mcnemar_exact(0, 0) == 1.0 and compare.mcnemar_exact(3, 3) == 1.0
    assert compare.mcnemar_exact(0, 10) == pytest.approx(2 / 1024)
    x = dict(enumerate([1, 1, 1, 1, 1, 0, 0, 0, 0, 0]))
    y = dict(enumerate([1, 1, 1, 0, 0, 1, 1, 1, 1, 0]))
    q = compare.paired(x, y)
    # d = y - x: two -1, four +1, four 0 -> mean 0.2, sample var 5.6 / 9
    assert (q["n"], q["b"], q["c"]) == (10, 2, 4) and q["diff"] == pytest.approx(0.2)
    assert q["se"] == pytest.approx((5.6 / 9) ** 0.5 / 10 ** 0.5)
    assert q["p"] == pytest.approx(2 * (1 + 6 + 15) / 64)
    # fractional scores (an F1): b / c and p are the sign test of the same differences as diff, not of perfect scores
    q = compare.paired(dict.fromkeys(range(30), 0.5), dict.fromkeys(range(30), 0.9))
    assert (q["b"], q["c"]) == (0, 30) and q["diff"] == pytest.approx(0.4) and q["p"] == pytest.approx(2 / 2 ** 30)
    q = compare.paired(dict.fromkeys(range(10), 0.5), {i: 1.0 if i < 3 else 0.0 for i in range(10)})
    assert (q["b"], q["c"]) == (7, 3) and q["diff"] == pytest.approx(-0.2)
    # no task in common: no statistic at all, not "no difference"
    assert compare.paired({1: 1.0}, {2: 0.0}) == {"n": 0, "x": None, "y": None, "diff": None, "se": None, "b": 0,
                                                  "c": 0, "p": None}


def _arm(tmp_path, name, right, task=lambda i: {"question": f"What is {i} + 0 + 7 - {i}?", "answer": "7"}):
    """A run directory whose val episodes at step 2 answer task(i) right iff right[i] (config.json at its root only:
    a run killed before its first checkpoint)."""
    d = tmp_path / name
    (d / "trajectories").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(to_dict(load_config_file("configs/tiny_math_3agent.py"))))
    recs = [record(2, ["\\boxed{7}" if ok else "\\boxed{6}", "Verdict: Correct"], task(i), i) for i, ok in enumerate(right)]
    trajectories.write(d / "trajectories" / "val_step_000002.jsonl", recs)
    (d / "metrics.jsonl").write_text(json.dumps({"step": 2, "time/step": 1.0}) + "\n")
    return d


def test_paired_table_between_arms_and_an_eval_dir(tmp_path, capsys):
    a = _arm(tmp_path, "a", [1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    b = _arm(tmp_path, "b", [1, 1, 1, 0, 0, 1, 1, 1, 1, 0])
    ev = tmp_path / "maj"  # an eval.py --maj-k output: the tasks in another order, one extra
    ev.mkdir()
    (ev / "results.json").write_text(json.dumps({"step": 24, "maj_k": 3, "generations_per_task": 3.0,
                                                 "tokens_per_task": 96.0}))
    maj = [{"task": {"question": f"What is {i} + 0 + 7 - {i}?", "answer": "7"}, "correct": float(i < 7)}
           for i in reversed(range(11))]
    (ev / "majority.jsonl").write_text("".join(json.dumps(r) + "\n" for r in maj))
    rows = compare.main([str(a), str(b), str(ev)])
    out = capsys.readouterr().out
    assert [r["team"] for r in rows] == [0.5, 0.7, pytest.approx(7 / 11)]
    assert "| a | b | 10 | 0.500 | 0.700 | +0.200 | 0.249 | +0.80 | 2 / 4 | 0.688 |" in out
    assert "(maj@3) | 10 | 0.500 | 0.700 | +0.200 |" in out  # matched by the task: 10 common tasks
    assert rows[2]["tokens"] == 96.0 and "| 3.00 | 96 |" in out  # the maj arm's budget: generations and tokens
    assert f"note: a has 10 tasks, {ev} (maj@3) 11: paired on the 10 they share only" in out  # said, not hidden


def test_tasks_pair_by_their_whole_record_not_by_question_and_answer(tmp_path, capsys):
    """Video tasks ask the same question of different videos (or with other choices): keyed by (question, answer)
    the ten collapsed into one, and equal arms were reported as b / c 1 / 0."""
    right = [1, 0, 1, 0, 1, 0, 1, 0, 1, 0]
    video = lambda i: {"question": "What is 3 + 4?", "answer": "7", "video": f"v{i // 2}", "choices": [str(i % 2), "7"]}
    a, b = _arm(tmp_path, "a", right, video), _arm(tmp_path, "b", right, video)
    rows = compare.main([str(a), str(b)])
    assert [len(r["per_task"]) for r in rows] == [10, 10]
    assert "| a | b | 10 | 0.500 | 0.500 | +0.000 | 0.000 | — | 0 / 0 | 1 |" in capsys.readouterr().out
    twice = _arm(tmp_path, "twice", [1, 0], lambda i: Q)  # one task held twice: copy pairs with copy
    assert list(compare.summarise(twice)["per_task"].values()) == [1.0, 0.0]


def test_arms_with_no_common_task_get_a_note_not_a_row_over_n_0(tmp_path, capsys):
    a = _arm(tmp_path, "a", [1, 0, 1])
    b = _arm(tmp_path, "b", [1, 1, 0], lambda i: {"question": f"What is {i} + 1 + 6 - {i}?", "answer": "7"})
    compare.main([str(a), str(b)])
    out = capsys.readouterr().out
    assert "| a | b |" not in out and "| 0 |" not in out
    assert "note: a has 3 tasks, b 3 and they share none (tasks match by their whole record): not paired" in out


def _records(f):
    return [json.loads(x) for x in f.read_text().splitlines()]


# name -> (how the run directory is broken, what the one line says): each ended in a traceback but two
MALFORMED_RUNS = {
    "no metrics.jsonl": (lambda r: (r / "metrics.jsonl").unlink(), r"metrics\.jsonl: no such file"),
    "garbage in metrics.jsonl": (lambda r: (r / "metrics.jsonl").write_text('{"step": 0}\n{oops\n{"step": 1}\n'),
                                 r"metrics\.jsonl:2: not JSON"),
    "a metrics row without a step": (lambda r: (r / "metrics.jsonl").write_text('{"time/step": 3}\n'),
                                     r"metrics\.jsonl:1: field 'step' must be an integer"),
    "a time/step that is text": (lambda r: (r / "metrics.jsonl").write_text('{"step": 1, "time/step": "slow"}\n'),
                                 r"metrics\.jsonl:1: field 'time/step' must be a finite number"),
    "a FIFO as metrics.jsonl": (lambda r: ((r / "metrics.jsonl").unlink(), os.mkfifo(r / "metrics.jsonl")),
                                r"metrics\.jsonl: not a regular file \(a FIFO\)"),
    "an empty eval file": (lambda r: (r / "trajectories" / "val_step_000002.jsonl").write_text(""),
                           r"val_step_000002\.jsonl: no episode"),
    "binary junk in an eval file": (lambda r: (r / "trajectories" / "val_step_000002.jsonl").write_bytes(b"\x00\xff\xfe" * 50),
                                    r"val_step_000002\.jsonl:1: not UTF-8"),
    "no eval files": (lambda r: [f.unlink() for f in (r / "trajectories").glob("*")], "has no val_step_"),
    "an eval file of another name": (lambda r: (r / "trajectories" / "val_step_x.jsonl").write_text(""),
                                     r"val_step_x\.jsonl: not a val_step_<step>\.jsonl name"),
    "two files for one step": (lambda r: (r / "trajectories" / "val_step_2.jsonl").write_text(""), "both the eval at step 2"),
    "mismatched steps": (lambda r: trajectories.write(r / "trajectories" / "val_step_000002.jsonl",
                                                      [{**x, "step": 7} for x in _records(r / "trajectories" / "val_step_000002.jsonl")]),
                         r"val_step_000002\.jsonl:1: field 'step' is 7 in the file of the eval at step 2"),
    "a task the env cannot play": (lambda r: trajectories.write(r / "trajectories" / "val_step_000002.jsonl",
                                                                [{**record(2, EPISODES[0]), "task": {"prompt": "x"}}]),
                                   r"val_step_000002\.jsonl:1: the episode does not replay through the math_3agent workflow"),
    "binary junk as config.json": (lambda r: (r / "checkpoints" / "step_000002" / "config.json").write_bytes(b"\x89PNG\x00\xff"),
                                   r"step_000002/config\.json: not UTF-8"),
    "a config.json that is no config": (lambda r: (r / "checkpoints" / "step_000002" / "config.json").write_text('{"roles": 5}'),
                                        r"step_000002/config\.json is not a config"),
    "config.json a directory": (lambda r: ((r / "checkpoints" / "step_000002" / "config.json").unlink(),
                                           (r / "checkpoints" / "step_000002" / "config.json").mkdir()),
                                r"config\.json: not a regular file \(a directory\)"),
}


@pytest.mark.parametrize("case", list(MALFORMED_RUNS))
def test_a_malformed_run_directory_is_one_line(case, run):
    break_it, want = MALFORMED_RUNS[case]
    break_it(run)
    with pytest.raises(SystemExit) as e:
        compare.main([str(run)])
    msg = str(e.value.code)
    assert re.match(rf"^error: .*{want}", msg) and "\n" not in msg, msg


def test_bad_arms_and_outputs_are_one_line_and_clobber_nothing(run, tmp_path):
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "time/')  # a run killed mid-write: its torn last line is left out, not an error
    assert compare.main([str(run)])[0]["wall"] == 120.0
    log = (run / "metrics.jsonl").read_bytes()
    for out in ("--json", "--plot", "--judge-plot"):  # the run's own log is not an output, nor is RUN@N's
        for arm in (str(run), f"{run}@2"):
            with pytest.raises(SystemExit, match="refusing to overwrite a file inside a compared run"):
                compare.main([arm, out, str(run / "metrics.jsonl")])
    assert (run / "metrics.jsonl").read_bytes() == log
    f = tmp_path / "a_file"
    f.write_text("x")
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "results.json").write_text("[1]")
    for arm, want in ((tmp_path / "nope", "no such directory"), (f, "not a directory"),
                      (ev, r"results\.json: not eval\.py's results \(a JSON list")):
        with pytest.raises(SystemExit, match=rf"^error: {re.escape(str(arm))}.*{want}"):
            compare.main([str(arm)])
    (ev / "results.json").write_text("{}")
    (ev / "majority.jsonl").write_text(json.dumps({"task": Q, "correct": "yes"}) + "\n")
    with pytest.raises(SystemExit, match=r"majority\.jsonl:1: field 'correct' must be a finite number"):
        compare.main([str(ev)])
    r = subprocess.run([sys.executable, "compare.py", str(f)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [f"error: {f}: not a directory (give a train.py run "
                                                                   "directory or an eval.py output directory)"], r.stderr


def test_judge_curves_and_plot_read_what_train_logged(run, tmp_path, capsys):
    """--judge-plot draws metrics.jsonl's judge curves: train and val, verdicts and probes; a step logged twice
    (a resume) keeps its last value; a run with no judge is left out, and none at all is one line."""
    with pytest.raises(SystemExit, match="--judge-plot: no run logged a judge"):
        compare.main([str(run), "--judge-plot", str(tmp_path / "j.png")])
    rows = [{"step": 0, "val/evaluator_balanced_acc": 0.7, "val/evaluator_fpr": 0.35, "val/probe_fpr": 0.8},
            {"step": 1, "train/evaluator_balanced_acc": 0.5, "train/evaluator_fpr": 0.4, "train/probe_balanced_acc": 0.6,
             "time/step": 10.0},
            {"step": 2, "train/evaluator_balanced_acc": 0.9, "train/evaluator_fpr": None},
            {"step": 2, "train/evaluator_balanced_acc": 0.8, "val/evaluator_balanced_acc": 0.55,
             "val/evaluator_check_acc": 0.3}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "train/ev')
    assert compare.judge_curves(run) == {
        "val/evaluator_balanced_acc": [(0, 0.7), (2, 0.55)], "val/evaluator_fpr": [(0, 0.35)],
        "val/probe_fpr": [(0, 0.8)], "train/evaluator_balanced_acc": [(1, 0.5), (2, 0.8)],
        "train/evaluator_fpr": [(1, 0.4)], "train/probe_balanced_acc": [(1, 0.6)], "val/evaluator_check_acc": [(2, 0.3)]}
    out = tmp_path / "j.png"
    compare.main([str(run), "--judge-plot", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"judge plot: {out} ({run.name})" in capsys.readouterr().out
    (run / "metrics.jsonl").write_text('{"step": "x"}\n')
    with pytest.raises(SystemExit, match=r"metrics\.jsonl:1: not a metrics row"):
        compare.judge_curves(run)


def test_an_arm_at_a_step_pairs_a_run_with_its_own_start(run, capsys):
    """RUN@N is that run's eval at step N (recipes.py pairs RL's end with the SFT start it came from)."""
    start, end = compare.main([f"{run}@0", str(run)])
    assert (start["step"], start["team"], end["step"], end["team"]) == (0, 1.0, 2, 0.4)
    p = compare.paired(start["per_task"], end["per_task"])
    assert (p["n"], p["diff"], p["b"], p["c"]) == (5, pytest.approx(-0.6), 3, 0)
    out = capsys.readouterr().out
    assert f"{run.name}@0" in out and "-0.600" in out
    with pytest.raises(SystemExit, match="no eval at step 1"):
        compare.main([f"{run}@1", str(run)])


@pytest.mark.parametrize("config", ["math_tool", "code", "search", "react_calculator", "research", "tiny_swe",
                                    "video_qa", "tiny_math_3agent"])
def test_every_workflows_aggregate_reads_episodes_compare_replays(config):
    """compare.py hands a workflow's aggregate() episodes with metrics only (replayed, no tokens): every
    built-in's must take them (code, math_tool, react and swe read each episode's samples and crashed)."""
    import types

    from workflows import load_data, workflow
    cfg = load_config_file(f"configs/{config}.py")
    make_env, module, _ = workflow(cfg)
    task = load_data(cfg)[1][0]
    env, ms = make_env(), []
    turn, n = env.reset(task), 0
    while turn is not None and n < 30:
        turn, n = env.step("I do not know."), n + 1
    ms.append(env.metrics())
    if not hasattr(module, "aggregate"):  # optional (the search team has none)
        return
    out = module.aggregate([types.SimpleNamespace(metrics=m) for m in ms])
    assert isinstance(out, dict) and out and all(isinstance(v, float) for v in out.values())


def test_an_eval_folder_at_another_step_and_a_step_past_int_digits_are_one_line(run, tmp_path):
    """`compare.py base@7` on an eval.py folder (its step 0) answered with step 0, silently; RUN@<5000 digits> was a
    ValueError traceback (int() of more than 4300 digits). Each is one line; the eval folder at its own step is
    read as before."""
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "results.json").write_text(json.dumps({"step": 0}))
    (ev / "majority.jsonl").write_text(json.dumps({"task": Q, "correct": 1.0}) + "\n")
    with pytest.raises(SystemExit, match=rf"^error: {re.escape(str(ev))} is eval\.py's output of step 0, not step 7"):
        compare.main([f"{ev}@7"])
    assert compare.main([f"{ev}@0"])[0]["step"] == 0
    for arm in (f"{run}@{'9' * 5000}", f"{ev}@{'9' * 5000}"):
        r = subprocess.run([sys.executable, "compare.py", arm], cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and "not a step" in lines[0] and len(lines[0]) < 400, r.stderr[-500:]


def test_alone_adds_the_first_arms_members_paired_on_the_same_episodes(tmp_path, capsys):
    """--alone on an eval folder of real reason_code episodes (the env's own metrics; scripted replies, one round):
    the coder prints 11 (right) every time, the reasoner says 10 twice and 11 once, and the team's answer is the
    reasoner's. So the team scores 1/3, the coder alone 3/3 (team - coder alone = -2/3, b / c = 0 / 2), the
    reasoner alone 1/3; an arm that is not a greedy eval folder, or a non-finite member score, is one line."""
    from helpers import play

    from envs.reason_code import ReasonCodeEnv
    recs = []
    for i, said in enumerate((10, 10, 11)):
        task = {"question": f"Task {i}: what is 3 * 4 - 1?", "answer": "11"}
        replies = [f"So \\boxed{{{said}}}", "```python\nprint(3 * 4 - 1)\n```"]
        roles, rewards, m, _ = play(ReasonCodeEnv(max_rounds=1), task, replies)
        recs.append({"split": "eval_greedy", "step": 0, "task_id": i, "episode_id": i, "task": task, "truncated": False,
                     "error": None, "metrics": m, "turns": [{"turn": j, "role": r, "reply": x, "reward": w, "reply_tokens": 5}
                                                           for j, (r, x, w) in enumerate(zip(roles, replies, rewards))]})
    ev = tmp_path / "team_eval"
    ev.mkdir()
    (ev / "results.json").write_text(json.dumps({"step": 0}))
    trajectories.write(ev / "greedy.jsonl", recs)
    rows = compare.main([str(ev), "--alone"])
    out = capsys.readouterr().out
    assert [(r["run"], r["team"]) for r in rows] == [(f"{ev} (greedy)", pytest.approx(1 / 3)), (f"{ev} (coder alone)", 1.0),
                                                     (f"{ev} (reasoner alone)", pytest.approx(1 / 3))]
    assert (rows[1]["paired"]["diff"], rows[1]["paired"]["b"], rows[1]["paired"]["c"]) == (pytest.approx(2 / 3), 0, 2)
    assert rows[2]["paired"]["diff"] == 0 and f"{ev} (coder alone) | 3 | 0.333 | 1.000 | +0.667 |" in out
    assert len(compare.main([str(ev)])) == 1  # off: no member arm
    recs[1]["metrics"]["coder_alone"] = float("nan")
    trajectories.write(ev / "greedy.jsonl", recs)
    with pytest.raises(SystemExit, match=r"record 2: field 'metrics.coder_alone' must be a finite number"):
        compare.main([str(ev), "--alone"])
    (ev / "majority.jsonl").write_text(json.dumps({"task": recs[0]["task"], "correct": 1.0}) + "\n")
    with pytest.raises(SystemExit, match="--alone: .* is not an eval.py folder of greedy episodes"):
        compare.main([str(ev), "--alone"])

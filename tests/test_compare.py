"""compare.py: the README's arm table, recomputed from trajectory files by replaying the run's own env."""
import json

import pytest

import compare
import trajectories
from config import load_config_file, to_dict
from envs.math_3agent import MathTeamEnv

Q = {"question": "What is 3 + 4?", "answer": "7"}


def record(step, replies, task=Q, task_id=0):
    """The trajectory record train.py would write for this scripted episode (rewards from the env)."""
    env = MathTeamEnv(max_refinement_iterations=1)
    turn, roles = env.reset(task), []
    for r in replies:
        roles.append(turn.role)
        turn = env.step(r)
    turns = [{"turn": i, "role": ro, "prompt": "", "reply": r, "reward": w}
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
    assert "0.400 ± 0.219" in capsys.readouterr().out and (run / "c.png").stat().st_size > 0
    assert compare.main([str(run), "--step", "0"])[0]["team"] == 1.0


def test_a_reward_the_env_does_not_give_is_an_error(run):
    f = run / "trajectories" / "val_step_000002.jsonl"
    recs = trajectories.read(f)
    recs[3]["turns"][1]["reward"] = 1.0  # the fp verdict recorded as right
    trajectories.write(f, recs)
    with pytest.raises(ValueError, match="val_step_000002.jsonl: task 0 turn 1 .evaluator_critique. replays to reward -1"):
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


def _arm(tmp_path, name, right):
    """A run directory whose val episodes at step 2 answer task i right iff right[i] (config.json at its root only:
    a run killed before its first checkpoint)."""
    d = tmp_path / name
    (d / "trajectories").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(to_dict(load_config_file("configs/tiny_math_3agent.py"))))
    recs = [record(2, ["\\boxed{7}" if ok else "\\boxed{6}", "Verdict: Correct"],
                   {"question": f"What is {i} + 0 + 7 - {i}?", "answer": "7"}, i) for i, ok in enumerate(right)]
    trajectories.write(d / "trajectories" / "val_step_000002.jsonl", recs)
    (d / "metrics.jsonl").write_text(json.dumps({"step": 2, "time/step": 1.0}) + "\n")
    return d


def test_paired_table_between_arms_and_an_eval_dir(tmp_path, capsys):
    a = _arm(tmp_path, "a", [1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    b = _arm(tmp_path, "b", [1, 1, 1, 0, 0, 1, 1, 1, 1, 0])
    ev = tmp_path / "maj"  # an eval.py --maj-k output: the tasks in another order, one extra
    ev.mkdir()
    (ev / "results.json").write_text(json.dumps({"step": 24, "maj_k": 3, "generations_per_task": 3.0}))
    maj = [{"task": {"question": f"What is {i} + 0 + 7 - {i}?", "answer": "7"}, "correct": float(i < 7)}
           for i in reversed(range(11))]
    (ev / "majority.jsonl").write_text("".join(json.dumps(r) + "\n" for r in maj))
    rows = compare.main([str(a), str(b), str(ev)])
    out = capsys.readouterr().out
    assert [r["team"] for r in rows] == [0.5, 0.7, pytest.approx(7 / 11)]
    assert "| a | b | 10 | 0.500 | 0.700 | +0.200 | 0.249 | +0.80 | 2 / 4 | 0.688 |" in out
    assert "| 10 | 0.500 | 0.700 | +0.200 |" in out.split("(maj@3)")[-1]  # matched by question: 10 common tasks

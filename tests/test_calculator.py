"""rewards/calculator.py: components on hand-made trajectories equal hand-computed values; --stats."""
import json

import pytest

from rewards import calculator as C


def turn(role, reply, tokens, reward=None, finish="stop"):
    return {"role": role, "prompt": f"<{role} prompt>", "reply": reply, "reply_tokens": tokens,
            "finish_reason": finish, "reward": reward}


def team_episode():
    """generator wrong -> evaluator rejects -> refiner right -> evaluator accepts (claiming a wrong answer)."""
    return {"split": "train", "step": 1, "task_id": 0, "episode_id": 0,
            "task": {"question": "What is 2 + 3?", "answer": "5"}, "truncated": False, "error": None,
            "metrics": {"team_reward": 1.0},
            "turns": [turn("generator_initial", "2 + 3 = 6.\nSo the result is \\boxed{6}.", 10, 0.0),
                      turn("evaluator_critique", "2 + 3 is 5, not 6. The solution is wrong.\nVerdict: Incorrect", 12, 1.0),
                      turn("generator_refinement", "\\boxed{5}", 4, 1.0),
                      turn("evaluator_critique", "It checks out: the answer is 7\nVerdict: Correct", 30, 1.0)]}


def test_math_3agent_components_by_hand():
    calc = C.RewardCalculator(budgets={"generator_initial": 20, "evaluator_critique": 20, "generator_refinement": 20})
    s = calc.score_episode(team_episode())
    assert [x.role for x in s] == ["generator_initial", "evaluator_critique", "generator_refinement", "evaluator_critique"]
    # generator: wrong (0); tokens 1 - 10/20, one refinement of 3 -> turns 2/3; boxed; two steps before the box
    assert s[0].components == pytest.approx({"completion": 0.0, "efficiency": (0.5 + 2 / 3) / 2, "quality": 1.0,
                                             "reasoning": 1.0})
    assert s[0].weighted == pytest.approx(0.2 * 7 / 12 + 0.3 + 0.1)
    assert s[0].recorded == 0.0
    # evaluator: rejects a wrong solution (1); tokens 1 - 12/20; format, match, calibration (no answer claimed) all 1
    assert s[1].components == pytest.approx({"completion": 1.0, "efficiency": 0.4, "quality": 1.0, "reasoning": 1.0})
    assert s[1].weighted == pytest.approx(0.4 + 0.08 + 0.3 + 0.1)
    # refiner: right; tokens 1 - 4/20 and turns 2/3; no step before the answer
    assert s[2].components == pytest.approx({"completion": 1.0, "efficiency": (0.8 + 2 / 3) / 2, "quality": 1.0,
                                             "reasoning": 0.0})
    # evaluator: accepts a right solution, but over budget (0) and claims the answer is 7 (calibration 0);
    # one step before the verdict line
    assert s[3].components == pytest.approx({"completion": 1.0, "efficiency": 0.0, "quality": 2 / 3, "reasoning": 0.5})
    assert s[3].weighted == pytest.approx(0.4 + 0.3 * 2 / 3 + 0.1 * 0.5)


def test_evaluator_that_accepts_a_wrong_solution_and_unparseable_verdicts():
    ep = team_episode()
    ep["turns"][1]["reply"] = "Looks fine to me.\n**Verdict: Correct**"  # wrong: the solution said 6
    ep["turns"][3]["reply"] = "hmm"  # no verdict at all
    s = C.RewardCalculator(default_budget=20).score_episode(ep)
    assert s[1].components["completion"] == 0.0
    assert s[1].components["quality"] == pytest.approx((1 + 0 + 0) / 3)  # markup is fine: the line is a verdict
    assert s[3].components == pytest.approx({"completion": 0.0, "efficiency": 0.0, "quality": 0.0, "reasoning": 0.0})
    ep["turns"][1]["reply"] = "The solution is correct, I think, yes."  # a verdict word, no verdict line
    assert C.RewardCalculator().score_episode(ep)[1].components["quality"] == pytest.approx(0.5 / 3)


def test_math_single_weights_and_failed_episodes():
    ep = {"task": {"question": "q", "answer": "12"}, "metrics": {}, "truncated": False, "error": None,
          "turns": [turn("solver", "#### 12", 3, 1.0)]}
    calc = C.RewardCalculator(budgets={"solver": 10})
    (s,) = calc.score_episode(ep)
    # right; tokens only (no turns term in a single turn); "#### x" is half format; no steps
    assert s.components == pytest.approx({"completion": 1.0, "efficiency": 0.7, "quality": 0.5, "reasoning": 0.0})
    assert s.weighted == pytest.approx(0.4 + 0.14 + 0.15)
    (s,) = C.RewardCalculator({"efficiency": 0}, {"solver": 10}).score_episode(ep)
    assert s.weighted == pytest.approx((0.4 + 0.15) / 0.8)  # renormalised over the weights that count
    ep["turns"][0]["finish_reason"] = "length"
    assert calc.score_episode(ep)[0].components["efficiency"] == 0.0
    ep["turns"][0]["finish_reason"] = "stop"
    ep["truncated"] = True
    assert calc.score_episode(ep)[0].components["efficiency"] == 0.0
    with pytest.raises(ValueError, match="unknown reward component 'speed'"):
        C.RewardCalculator({"speed": 1.0})
    with pytest.raises(ValueError, match="must not all be 0"):
        C.RewardCalculator(dict.fromkeys(C.COMPONENTS, 0.0))
    with pytest.raises(ValueError, match="finite number >= 0"):
        C.RewardCalculator({"quality": float("nan")})


def test_generic_workflow_tools_and_errors():
    ep = {"task": {"question": "q", "answer": "3"}, "metrics": {"tool_calls": 4, "tool_errors": 1},
          "turns": [turn("agent", "Thought: compute.\nAction: answer[3]", 50, 0.5)]}
    calc = C.RewardCalculator(default_budget=100)
    (s,) = calc.score_episode(ep)
    assert C.detect_workflow(ep) == "generic"
    # completion = the recorded reward; efficiency = mean(tokens 0.5, tools 3/4); stopped on its own; no answer
    assert s.components == pytest.approx({"completion": 0.5, "efficiency": 0.625, "quality": 1.0})
    assert s.weighted == pytest.approx((0.2 + 0.125 + 0.3) / 0.9)
    ep["error"] = "ValueError: boom"
    assert calc.score_episode(ep)[0].weighted == pytest.approx((0.2 + 0.3) / 0.9)
    ep["turns"][0]["reward"] = 7.0  # shaped rewards are clipped into [0, 1]
    assert calc.score_episode(ep)[0].components["completion"] == 1.0


def test_rescore_episodes_online_uses_the_same_numbers():
    from rollout import Episode, Sample
    rec = team_episode()
    steps = [Sample(0, 0, t["role"], i, [1, 2], [3] * t["reply_tokens"], [0.0] * t["reply_tokens"], reward=t["reward"],
                  finish_reason="stop", text=t["reply"]) for i, t in enumerate(rec["turns"])]
    ep = Episode(0, 0, None, steps, rec["metrics"], task=rec["task"])
    calc = C.RewardCalculator(default_budget=20)
    want = [x.weighted for x in calc.score_episode(rec)]
    C.rescore_episodes(calc, [ep])
    assert [s.reward for s in ep.samples] == pytest.approx(want)
    assert ep.samples[0].env_reward == 0.0 and ep.samples[0].reward_components["completion"] == 0.0
    C.rescore_episodes(calc, [ep])  # idempotent: it starts from the env's reward again
    assert [s.reward for s in ep.samples] == pytest.approx(want)
    assert [s.env_reward for s in ep.samples] == [t["reward"] for t in rec["turns"]]


def test_a_file_written_with_calculator_rewards_is_read_by_its_env_reward():
    ep = {"task": {"question": "q", "answer": ""}, "metrics": {},
          "turns": [{**turn("speaker", "777", 50, 0.3), "env_reward": 1.0}]}
    (s,) = C.RewardCalculator(default_budget=100).score_episode(ep)
    assert s.recorded == 1.0 and s.components["completion"] == 1.0  # not the weighted 0.3 again
    ep["turns"][0]["env_reward"] = "high"
    with pytest.raises(C.TrajectoryError, match=r"turns\[0\]\.env_reward must be a finite number"):
        C.check_record(ep, "f.jsonl:1")


def test_from_config_takes_budgets_and_workflow():
    from config import load_config_file
    cfg = load_config_file("configs/tiny_math_3agent.py")
    calc = C.RewardCalculator.from_config(cfg, {"reasoning": 0.0})
    assert calc.budgets == {"generator_initial": 12, "evaluator_critique": 8, "generator_refinement": 12}
    assert calc.workflow == "math_3agent" and calc.max_refinements == 1 and calc.weights["reasoning"] == 0.0


def test_hostile_replies_never_raise():
    calc = C.RewardCalculator()
    for bad in ["\n" * 40000, "verdict" + " " * 40000 + "x", "\\boxed{" * 10000, "answer is " * 4000, "\x00\ud800" * 100,
                ". " * 20000]:
        ep = team_episode()
        for t in ep["turns"]:
            t["reply"] = bad
        for s in calc.score_episode(ep):
            assert all(0.0 <= v <= 1.0 for v in s.components.values()) and 0.0 <= s.weighted <= 1.0


# --------------------------------------------------------------------------------------------- --stats


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_stats_over_a_glob(tmp_path, capsys):
    single = [{"task": {"question": "q", "answer": "4"}, "metrics": {},
               "turns": [turn("solver", f"Add them.\nWe get \\boxed{{{a}}}", 10, float(a == 4))]} for a in (4, 4, 5, 6)]
    write(tmp_path / "train_step_000001.jsonl", single[:2])
    write(tmp_path / "train_step_000002.jsonl", single[2:])
    (tmp_path / "other.txt").write_text("not matched")
    calc = C.RewardCalculator(budgets={"solver": 20})
    st = C.stats(C.load_records(str(tmp_path / "train_*.jsonl")), calc, min_reward=0.7)
    d = st["solver"]
    # right answers: 0.4 + 0.2 * 0.5 + 0.3 + 0.1 = 0.9; wrong ones 0.5
    assert d["turns"] == 4 and d["weighted"]["n"] == 4
    assert d["weighted"]["mean"] == pytest.approx(0.7) and d["weighted"]["min"] == pytest.approx(0.5)
    assert d["weighted"]["max"] == pytest.approx(0.9) and d["weighted"]["std"] == pytest.approx(0.2)
    assert d["weighted"]["p50"] == pytest.approx(0.7) and d["weighted"]["p25"] == pytest.approx(0.5)
    assert d["completion"]["mean"] == 0.5 and d["recorded"]["mean"] == 0.5
    assert d["frac_weighted_ge_min"] == 0.5 and d["frac_recorded_ge_min"] == 0.5
    out = C.main(["--stats", str(tmp_path / "train_*.jsonl"), "--min-reward", "0.7", "--budget", "solver=20",
                  "--json", str(tmp_path / "s.json")])
    assert out == st and json.loads((tmp_path / "s.json").read_text()) == st
    text = capsys.readouterr().out
    assert "4 episodes, 4 turns" in text and "solver" in text and "reward >= 0.7: weighted 50.0%" in text
    st = C.main(["--stats", str(tmp_path / "train_*.jsonl"), "--weights", "efficiency=0,reasoning=0",
                 "--min-reward", "0.9"])
    assert st["solver"]["weighted"]["max"] == pytest.approx(1.0) and st["solver"]["frac_weighted_ge_min"] == 0.5


@pytest.mark.parametrize("line,msg", [
    ("{not json", "bad JSON"), ('{"task": {}}', "field 'turns' is missing"),
    ('{"turns": [{"role": "solver"}]}', r"turns\[0\]\.reply is missing"),
    ('{"turns": [{"role": "solver", "reply": "x", "reward": "high"}]}', r"turns\[0\]\.reward must be a finite number"),
    ("[1, 2]", "a JSON list")])
def test_malformed_lines_name_file_and_line(tmp_path, line, msg):
    good = json.dumps({"turns": [turn("solver", "x", 1, 0.0)]})
    f = tmp_path / "t.jsonl"
    f.write_text(good + "\n\n" + line + "\n")
    with pytest.raises(C.TrajectoryError, match=rf"t\.jsonl:3: .*{msg}"):
        C.load_records(str(f))
    with pytest.raises(SystemExit, match=r"error: .*t\.jsonl:3"):
        C.main(["--stats", str(f)])
    with pytest.raises(FileNotFoundError, match="no trajectory file matches"):
        C.load_records(str(tmp_path / "nothing_*.jsonl"))


def test_bad_json_and_config_arguments_are_one_line_and_lose_no_file(tmp_path, capsys):
    """--json DIR wrote the statistics into a directory (IsADirectoryError traceback, after the whole
    run); --json naming a trajectory file read overwrote it; a config without `config` was a TypeError."""
    f = write(tmp_path / "train_1.jsonl", [{"task": {"question": "q", "answer": "4"}, "metrics": {},
                                            "turns": [turn("solver", "\\boxed{4}", 1, 1.0)]}])
    before = f.read_bytes()
    for out, msg in [(tmp_path, "is a directory; name a file in it, e.g. .*stats.json"),
                     (tmp_path / "no" / "s.json", "its folder .*no does not exist"),
                     (f, "is one of the trajectory files read; it would be overwritten")]:
        for stats in (str(f), str(tmp_path / "train_*.jsonl"), str(tmp_path)):
            with pytest.raises(SystemExit, match=rf"^error: --json .*: {msg}$") as e:
                C.main(["--stats", stats, "--json", str(out)])
            assert "\n" not in str(e.value.code)
    assert f.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["train_1.jsonl"]
    (tmp_path / "cfg.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match=r"^error: .*cfg\.py must define `config = Config\(\.\.\.\)`"):
        C.main(["--stats", str(f), "--config", str(tmp_path / "cfg.py")])
    assert C.main(["--stats", str(f), "--json", str(tmp_path / "s.json")]) == json.loads((tmp_path / "s.json").read_text())

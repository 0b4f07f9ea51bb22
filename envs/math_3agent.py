"""The 3-agent math team: generator -> evaluator -> (refiner -> evaluator)* on one shared history.

    problem -> generator_initial    proposes a solution ending in \\boxed{answer}
            -> evaluator_critique   critique ending in "Verdict: Correct" / "Verdict: Incorrect"
            -> if Incorrect: generator_refinement (sees everything so far) -> evaluator_critique
            ... until the evaluator says Correct or max_refinement_iterations refinements were made.

The env contract it implements is envs/__init__.py's; a task is {"question": str, "answer": str}, and
metrics() holds episode-level counts that `aggregate` turns into rates over a batch.

Rewards, per turn of each role (the options are constructor arguments, `data.env_kwargs` in a config):
    generator_initial     1 if its answer is correct, else 0 (no \\boxed answer = 0)
    evaluator_critique    evaluator_reward="symmetric" (default): +1 if its verdict matches the truth
                          of the solution it judged, -1 if not (an unparseable verdict is -1 and counts
                          as "Incorrect" for the flow: the team never accepts an unverified solution);
                          "accuracy": 1 if its verdict matches, else 0.
                          evaluator_mixed_groups_only=True (default) labels each verdict with the truth
                          of what it judged (`turn_labels`): the trainer then leaves out of the update
                          every (task, evaluator) group whose judged solutions were all right or all
                          wrong. There a judge can only learn the problem's difficulty; on a
                          mostly-correct batch that is "approve", and approving everything would pay. In a
                          mixed group a group-centred estimator gives an approve-all judge zero net
                          push and rewards only discrimination.
    generator_refinement  refiner_reward="relative" (default): credit against the answer it was given:
                          a fix (wrong -> right) +1, a break (right -> wrong) -1, keeping a right answer
                          +0.5, staying wrong 0. "correctness": 1 if its answer is correct, else 0, plus
                          the optional shaping fix_bonus / break_penalty (0 by default).
The team reward (metrics()["team_reward"]) is the correctness of the final answer.

evaluator_prompt="check" asks the judge to write its own check before the verdict: the last digit and
the size of the result, then its own result (agents.math_team.check_line; sft.py's math teacher writes
exactly that line when the train config sets it, so the judge can start from it); "plain" (default): the
critique and the verdict alone.
evaluator_prompt="blind": the judge writes that check line BEFORE it sees the solution, in a turn of its
own (the problem only), and gives each verdict in the same conversation after it (agents.math_team.
blind_messages), so its check cannot copy the solution's answer (a judge shown the solution first does, and
then approves it: docs/experiments.md, arm (e)). The check turn is the judge's once an episode, before
its first verdict; every later verdict (after a refinement, and the probes) extends the same check. It is paid for its result against the truth (+-1 / 1-0 as the verdicts,
unlabelled), counted as eval_checks / eval_check_right (aggregate's evaluator_check_acc); the team sees
the check line and the verdict together as the judge's critique.
evaluator_prompt="digit": a blind check that is a cheap necessary condition, not the result: the sign and
the last digit, worked from the operands' last digits ("Check: 3 + 5 = 8, so the answer ends in 8.",
agents.math_team.digit_check_line), and a verdict that compares the solution's answer against it: a
claim small enough for a small judge to get right, where a wrong full result would reject right solutions
(T1, arXiv 2504.04718; docs/experiments.md, arms e-blind and e-digit). The check turn is paid on its claim
(sign and last digit) against the truth (digit_check_right; 0 where the truth is not a whole number); a wrong
answer that ends in the right digit (a +-10 slip) passes it.
verdict_from_check=True (with evaluator_prompt="digit"): the judge writes its check and nothing else; each
verdict is the comparison the check asks for, made by the env (the whole number the solution's answer stands
for, read as math_reward reads it, has the claimed sign and last digit: Correct, else Incorrect; a check that
claims no digit: no verdict, so the team refines), and the team sees the check and the verdict in the words
the teacher taught the judge's verdict turn (agents.math_team.digit_verdict), as it saw the judge's own.
The comparison needs no learning, so RL cannot erode it (a judge's own verdicts drifted from its check under
RL: docs/experiments.md, arm e-digit). The judge then learns only what a judge must: the check (paid on its
claim as above); probes are judged the same way and count in probe_* but train nothing (no model turn); there
probe_* measure the check against the near misses drawn (a +-10 miss always passes a right check), not a judge's
reading, so they do not compare with those of a judge that writes its verdicts.
A truth that is not a whole number has no digit to claim: the check claims none, no verdict is given and the
team refines to its limit (the arithmetic data is all whole numbers). Off = the judge writes its verdicts.
With verdict_from_check the env also plays a perfect team for sft.py's scripted teacher: scripted_replies (the
right solution, then the check) and scripted_repair (the refiner's lesson: a mistake the check catches, never
taught, then "The answer must end in d: ..." and the right result).

layout="per_role": each role keeps its own growing chat (agents.math_team.role_messages): the judge's later
verdicts continue its first one (each new solution arrives as a new message after its own critique), and the
refiner's later refinements its first, token for token, so they share the prefix cache and train as one packed
row; "message" (default): each turn one user message holding the whole history (nothing extends: no packing).
The blind judge's check-and-verdict conversation is its own in either layout.

probes=True adds hard negatives for the judge (SPC, Master-RM: a judge must catch near misses, not
only the generator's current mistakes): after the team's last turn, when the generator's first
solution is right, the judge also judges that solution with its answer turned into a near miss
(near_miss: +-1, +-2, +-10 or its last two digits swapped, every occurrence of the answer in the text
changed so it reads consistently; never equal to the truth), labelled wrong, and the solution as it
is, labelled right, in an order drawn from the text. Probes train the judge only: they come after the
team's last turn, never enter the history the other roles see, the final answer, team_reward or the
evaluator_* counts; their verdicts are paid like the judge's (+-1 / 1-0) and counted apart (probe_*;
aggregate's probe_balanced_acc, probe_fpr), at train and at val.
"""
from __future__ import annotations

import random
import re
import zlib
from collections import defaultdict

from agents.math_team import (answer_number, blind_messages, build_messages, digit_check_line, digit_check_right, digit_claim,
                              digit_consistent, digit_verdict, parse_verdict, role_messages, solution_text, whole)
from rewards.math import REVISION_REWARD, extract_answer, math_reward
from envs import Prompt, judge_rates, need_bool, need_choice, need_int, need_number

ROLES = ("generator_initial", "evaluator_critique", "generator_refinement")


class MathTeamEnv:
    roles = ROLES

    def __init__(self, max_refinement_iterations: int = 3, evaluator_reward: str = "symmetric",
                 evaluator_mixed_groups_only: bool = True, refiner_reward: str = "relative", fix_bonus: float = 0.0,
                 break_penalty: float = 0.0, probes: bool = False, evaluator_prompt: str = "plain",
                 verdict_from_check: bool = False, layout: str = "message"):
        if evaluator_reward not in ("symmetric", "accuracy"):
            raise ValueError(f"evaluator_reward must be 'symmetric' or 'accuracy', got {evaluator_reward!r}")
        if refiner_reward not in ("relative", "correctness"):
            raise ValueError(f"refiner_reward must be 'relative' or 'correctness', got {refiner_reward!r}")
        need_int("max_refinement_iterations", max_refinement_iterations, 0, 100)
        need_bool("evaluator_mixed_groups_only", evaluator_mixed_groups_only)
        need_bool("probes", probes)
        if evaluator_prompt not in ("plain", "check", "blind", "digit"):
            raise ValueError(f"evaluator_prompt must be 'plain', 'check', 'blind' or 'digit', got {evaluator_prompt!r}")
        if need_bool("verdict_from_check", verdict_from_check) and evaluator_prompt != "digit":
            raise ValueError(f"verdict_from_check needs evaluator_prompt='digit' (a check that claims a sign and a "
                             f"last digit to compare against), got evaluator_prompt={evaluator_prompt!r}")
        self.derived = verdict_from_check
        self.per_role = need_choice("layout", layout, ("message", "per_role")) == "per_role"
        self.blind_style = {"blind": "evaluator_blind", "digit": "evaluator_digit"}.get(evaluator_prompt)
        self.blind = self.blind_style is not None  # a check turn of its own, before the solution
        self.judge_prompt = {"plain": "evaluator_critique", "check": "evaluator_check"}.get(evaluator_prompt)
        fix_bonus, break_penalty = need_number("fix_bonus", fix_bonus, 0, 10), need_number("break_penalty", break_penalty, 0, 10)
        if refiner_reward == "relative" and (fix_bonus or break_penalty):
            raise ValueError("fix_bonus / break_penalty shape refiner_reward='correctness'; 'relative' already pays a "
                             "fix and charges a break")
        self.max_refinements = max_refinement_iterations
        self.evaluator_reward, self.mixed_only, self.refiner_reward = evaluator_reward, evaluator_mixed_groups_only, refiner_reward
        self.fix_bonus, self.break_penalty, self.probes = fix_bonus, break_penalty, probes

    def scripted_replies(self, task: dict) -> list[str]:
        """A perfect team's replies (sft.py's scripted teacher), for the env with verdict_from_check: the
        generator's right solution in its own words ("53 + 75 = 128, so the answer is \\boxed{128}."), then the
        judge's digit check (agents.math_team.digit_check_line); the env's verdict ends the episode. [] for a
        judge that writes its own verdicts (its teacher is sft.py's teacher=math)."""
        q, y = task["question"], str(task["answer"])
        return [solution_text(q, y), digit_check_line(q, y)] if self.derived else []

    def scripted_repair(self, task: dict) -> list[str] | None:
        """The refiner's lesson (sft.py's scripted teacher plays it and never teaches its first reply), for the
        env with verdict_from_check: a first solution whose answer is a mistake the digit check catches (+-1,
        +-2, another last digit, the last two digits swapped or the sign flipped, drawn per task), the judge's
        check (the env's verdict on it: Incorrect), then the refiner's fix: the sign and last digit the check
        claims, then the right result ("The answer must end in 8: 53 + 75 = 128, so the answer is
        \\boxed{128}."). None when the truth is not a whole number, or the judge writes its own verdicts. A fix
        a small refiner can learn where its mistake is a slip of the last digit or the sign and the check is
        right (how often that is: docs/experiments.md, arms e-refine and g)."""
        q, y = task["question"], str(task["answer"])
        t = whole(y)
        if t is None or not self.derived:
            return None
        n = int(t)
        rng = random.Random(zlib.crc32(q.encode("utf-8", "replace")))
        cands = [n + 1, n - 1, n + 2, n - 2, -n, (-1 if n < 0 else 1) * (abs(n) // 10 * 10 + rng.randrange(10)),
                 _swap_last_two(n)]
        cands = [c for c in cands if c is not None and not digit_consistent(str(c), y)]
        if not cands:
            return None
        wrong = rng.choice(cands)
        fix = f"The answer must {'be negative and ' * (n < 0)}end in {t[-1]}: {solution_text(q, y)}"
        return [solution_text(q, y, str(wrong)), digit_check_line(q, y), fix]

    def reset(self, task: dict) -> Prompt:
        self.problem, self.answer = task["question"], str(task["answer"])
        self.history: list[tuple[str, str]] = []  # (role, text), everything said so far
        self.rewards: list[float] = []
        self.labels: list = []  # per model turn, turn_labels()
        self.check: str | None = None  # evaluator_blind: the judge's check line, once it wrote it
        self.check_right: bool | None = None
        self.solution_correct: list[bool] = []  # correctness of each generator turn
        self.verdicts: list[bool | None] = []
        self.judged: list[bool] = []  # truth of the solution each verdict judged
        self.refinements = 0
        self.done = False
        self.probe_queue: list[tuple[str, bool]] | None = None  # (solution shown, its truth), once the team is done
        self.probe_results: list[tuple[bool | None, bool]] = []  # (verdict, truth) of each probe judged
        return self._turn("generator_initial")

    def _turn(self, role):
        self.role = role
        if role == "evaluator_critique" and self.blind:  # its check first (the problem only), then the verdict
            return Prompt(role, blind_messages(self.problem, self.check, self.history, self.blind_style))
        prompt = self.judge_prompt if role == "evaluator_critique" else role
        if self.per_role:  # its own growing chat: a later verdict or refinement continues its earlier one
            return Prompt(role, role_messages(prompt, role, self.problem, self.history))
        return Prompt(role, build_messages(prompt, self.problem, self.history))

    def _pay(self, reward: float, label=None):
        self.rewards.append(reward)
        self.labels.append(label if self.mixed_only else None)

    def step(self, reply: str) -> Prompt | None:
        if self.done:
            raise RuntimeError("step() after the episode ended")
        if self.probe_queue is not None:  # a probe's verdict: the judge's reward, nothing else changes
            verdict, truth = parse_verdict(reply), self.probe_queue.pop(0)[1]
            self.probe_results.append((verdict, truth))
            self._pay(self._judge_reward(verdict, truth), truth)
            return self._next_probe()
        role = self.role
        if role == "evaluator_critique" and self.blind and self.check is None:  # the blind check: paid on its result
            self.check, self.check_right = reply, (digit_check_right(reply, self.answer) if self.blind_style ==
                                                   "evaluator_digit" else math_reward(reply, self.answer) == 1.0)
            self._pay(0.0 if self.check_right is None else self._judge_reward(self.check_right, True))  # None: no digit
            self.claim = digit_claim(reply) if self.derived else None
            return self._judged(self._check_verdict(self.history[-1][1])) if self.derived else self._turn(role)
        self.history.append((role, reply if not (self.blind and role == "evaluator_critique")
                             else f"{self.check.strip()}\n{reply.strip()}"))
        if role in ("generator_initial", "generator_refinement"):
            ok = math_reward(reply, self.answer) == 1.0
            r = float(ok)
            if role == "generator_refinement":
                prev = self.solution_correct[-1]
                if self.refiner_reward == "relative":  # fix +1, break -1, keep right +0.5, stay wrong 0
                    r = REVISION_REWARD[(prev, ok)]
                else:
                    r += self.fix_bonus * (ok and not prev) - self.break_penalty * (prev and not ok)
                self.refinements += 1
            self.solution_correct.append(ok)
            self._pay(r)
            if self.derived and self.check is not None:  # the check is written once; each verdict is its comparison
                return self._judged(self._check_verdict(reply))
            return self._turn("evaluator_critique")
        verdict = parse_verdict(reply)  # the judge's own verdict
        self._pay(self._judge_reward(verdict, self.solution_correct[-1]), self.solution_correct[-1])
        return self._judged(verdict)

    def _check_says(self, solution: str) -> tuple[bool | None, str]:
        """verdict_from_check: the verdict on a solution and its words (agents.math_team.digit_verdict, as
        sft.py's teacher taught them: "The solution says 120: it ends in 0, not 8.\nVerdict: Incorrect"):
        whether its answer (the whole number it stands for, as math_reward reads it) has the sign and last
        digit the judge's check claims; (None, "No verdict.") when the check claims none."""
        if self.claim is None:
            return None, "No verdict."
        said = extract_answer(solution)
        return digit_verdict(said, answer_number(said), self.claim)

    def _check_verdict(self, solution: str) -> bool | None:
        """The check's verdict on the team's latest solution; the team sees the check and its words as the
        judge's critique, as it saw the judge's own check and verdict turns."""
        verdict, said = self._check_says(solution)
        self.history.append(("evaluator_critique", f"{self.check.strip()}\n{said}"))
        return verdict

    def _judged(self, verdict: bool | None) -> Prompt | None:
        """After a verdict on the latest solution (the judge's, or its check's): count it, then accept,
        stop, or ask for a refinement."""
        self.verdicts.append(verdict)
        self.judged.append(self.solution_correct[-1])
        if verdict is True or self.refinements >= self.max_refinements:
            self.probe_queue = self._probes() if self.probes else []
            return self._next_probe()
        return self._turn("generator_refinement")

    def _judge_reward(self, verdict, truth) -> float:
        right = verdict is not None and verdict == truth
        return float(right) if self.evaluator_reward == "accuracy" else (1.0 if right else -1.0)

    def _probes(self) -> list[tuple[str, bool]]:
        """The first solution as it is (right) and as a near miss (wrong), when it was right."""
        first = self.history[0][1]
        miss = near_miss(first, self.answer) if self.solution_correct[0] else None
        if miss is None:
            return []
        pair = [(first, True), (miss, False)]
        random.Random(zlib.crc32(first.encode("utf-8", "replace"))).shuffle(pair)
        return pair

    def _next_probe(self) -> Prompt | None:
        while self.derived and self.probe_queue:  # judged by the check's comparison: no model turn, no reward
            shown, truth = self.probe_queue.pop(0)
            self.probe_results.append((self._check_says(shown)[0], truth))
        if not self.probe_queue:
            self.done = True
            return None
        self.role, shown = "evaluator_critique", [("generator_initial", self.probe_queue[0][0])]
        return Prompt("evaluator_critique", blind_messages(self.problem, self.check, shown, self.blind_style) if self.blind
                      else build_messages(self.judge_prompt, self.problem, shown))

    def final_answer(self) -> str | None:
        """The answer of the last solution (eval.py's majority vote)."""
        sols = [t for r, t in self.history if r != "evaluator_critique"]
        return extract_answer(sols[-1]) if sols else None

    def turn_rewards(self) -> list[float]:
        return list(self.rewards)

    def turn_labels(self) -> list:
        """Per model turn: the truth of the solution a verdict judged (verdicts and probes, when
        evaluator_mixed_groups_only), else None (the blind check included). The trainer leaves out groups
        whose labels all agree."""
        return list(self.labels)

    def metrics(self) -> dict:
        sc = self.solution_correct
        v = [(vd, t) for vd, t in zip(self.verdicts, self.judged)]
        return {
            "initial_correct": float(bool(sc) and sc[0]),
            "final_correct": float(bool(sc) and sc[-1]),
            "team_reward": float(bool(sc) and sc[-1]),
            # evaluator confusion counts; positive = verdict "Correct"
            "eval_tp": sum(vd is True and t for vd, t in v), "eval_fp": sum(vd is True and not t for vd, t in v),
            "eval_tn": sum(vd is False and not t for vd, t in v), "eval_fn": sum(vd is False and t for vd, t in v),
            "eval_unparsed": sum(vd is None for vd, _ in v),
            "eval_judged_right": sum(t for _, t in v),  # verdicts on correct solutions (unparsed included)
            "refinements": self.refinements,
            "refine_fixed": sum((not a) and b for a, b in zip(sc, sc[1:])),
            "refine_broken": sum(a and not b for a, b in zip(sc, sc[1:])),
            "refine_from_wrong": sum(not a for a in sc[:-1]),
            "refine_from_right": sum(bool(a) for a in sc[:-1]),
            "no_answer": sum(extract_answer(t) is None for r, t in self.history if r != "evaluator_critique"),
        } | ({} if not self.blind else {"eval_checks": float(self.check is not None),
                                        "eval_check_right": float(bool(self.check_right))}) \
          | ({} if not self.probes else {  # the probes' confusion counts, apart from the team's
            "probe_tp": sum(vd is True and t for vd, t in self.probe_results),
            "probe_fp": sum(vd is True and not t for vd, t in self.probe_results),
            "probe_tn": sum(vd is False and not t for vd, t in self.probe_results),
            "probe_fn": sum(vd is False and t for vd, t in self.probe_results),
            "probe_right": sum(t for _, t in self.probe_results), "probes": len(self.probe_results)})


def _swap_last_two(v: int) -> int | None:
    """v with its last two digits swapped (-47 -> -74); None when it has one digit or they are equal."""
    d = str(abs(v))
    return None if len(d) < 2 or d[-1] == d[-2] else (-1 if v < 0 else 1) * int(d[:-2] + d[-1] + d[-2])


def near_miss(solution: str, truth: str) -> str | None:
    """The solution with its final (integer) answer turned into a near miss: +-1, +-2, +-10, or its last
    two digits swapped, drawn from the text; every standalone occurrence of the answer in the text is
    changed, so the solution reads consistently. Never equal to the truth; None when the answer is
    not an integer. Linear time."""
    ans = extract_answer(solution)
    if ans is None or not re.fullmatch(r"-?\d{1,18}", ans.strip()):
        return None
    ans = ans.strip()
    v = int(ans)
    cands = [c for c in (v + 1, v - 1, v + 2, v - 2, v + 10, v - 10, _swap_last_two(v)) if c is not None]
    random.Random(zlib.crc32(solution.encode("utf-8", "replace"))).shuffle(cands)
    for c in cands:
        miss = re.sub(rf"(?<![\d.]){re.escape(ans)}(?![\d.])", str(c), solution)
        if math_reward(miss, truth) == 0.0:
            return miss
    return None


def check_config(cfg, grouped: tuple) -> tuple[str, str] | None:
    """evaluator_prompt="blind" or "digit" and the trainer (workflows.check_roles): the check turn is paid on
    its own result, the verdicts on theirs, so they must not share a group baseline, a label filter or a
    merged sequence (which keeps only the last turn's reward). layout="per_role": a role's verdicts (or fixes) in
    one chat are paid apart: no merged sequence either."""
    if cfg.data.env_kwargs.get("layout") == "per_role" and cfg.rollout.merge_turns:
        return ("rollout.merge_turns", "layout='per_role' keeps each role's turns in one chat, each turn paid on its own; "
                "merging would train the judge's earlier verdicts on its last one's reward (algo.pack_turns still "
                "packs them in one row)")
    style = cfg.data.env_kwargs.get("evaluator_prompt")
    if style not in ("blind", "digit"):
        return None
    if cfg.rollout.merge_turns:
        return ("rollout.merge_turns", f"evaluator_prompt={style!r}: merging the judge's check into its verdict "
                "would train the check on the verdict's reward; leave merge_turns off")
    judge = next((r for r in cfg.roles if r.name == "evaluator_critique"), None)
    if judge is not None and cfg.estimator_of(judge) in grouped and not cfg.algo.group_by_turn:
        return ("algo.group_by_turn", f"evaluator_prompt={style!r} with the judge's {cfg.estimator_of(judge)!r} "
                "(centred per group): the check turn (always turn 1) would share its group with the verdicts, "
                "their baseline and their label filter; set algo.group_by_turn=True or a per-turn estimator "
                "(reinforce++)")
    return None


CONSOLE = ("evaluator_balanced_acc", "evaluator_fpr", "evaluator_tpr", "evaluator_approve_rate")  # on the console line


def _balanced(tp, n_pos, tn, n_neg) -> float:
    """Balanced accuracy: the mean recall over the classes present (0.0 when none is)."""
    recalls = ([tp / n_pos] if n_pos else []) + ([tn / n_neg] if n_neg else [])
    return sum(recalls) / len(recalls) if recalls else 0.0


def aggregate(episodes) -> dict:
    """What is this workflow's own: ratios over counts summed across episodes (the trainer already
    logs the mean of every per-episode metric and each role's reward and response length)."""
    tot = defaultdict(float)
    for e in episodes:
        for k, v in e.metrics.items():
            tot[k] += v
    tp, fp, tn, fn = (tot[k] for k in ("eval_tp", "eval_fp", "eval_tn", "eval_fn"))
    n_right = tot["eval_judged_right"]  # verdicts on correct solutions; the rest judged wrong ones
    n_wrong = tp + fp + tn + fn + tot["eval_unparsed"] - n_right
    return {
        "evaluator_precision": tp / max(1, tp + fp),  # of "Correct" verdicts, how many were right
        "evaluator_recall": tp / max(1, tp + fn),  # of correct solutions, how many were approved
        "evaluator_acc": (tp + tn) / max(1, tp + fp + tn + fn + tot["eval_unparsed"]),
        # the mean of the recall on correct and on incorrect solutions, over the classes judged (as sklearn's
        # balanced_accuracy_score: a batch with no right solution is the recall on wrong ones, not half of it);
        # an unparsed verdict counts as wrong on both sides. Always "Correct" (or a coin) scores 0.5
        "evaluator_balanced_acc": _balanced(tp, n_right, tn, n_wrong),
        # of wrong solutions, the share approved (unparsed verdicts are not approvals)
        "evaluator_fpr": fp / max(1, n_wrong),
        # the judge's rates by name (envs.judge_rates): its own verdicts, unparsed ones approving nothing
        **judge_rates("evaluator", {"evaluator_tp": tp, "evaluator_fp": fp, "evaluator_tn": tn, "evaluator_fn": fn,
                                    "evaluator_none": n_right - tp - fn, "evaluator_none_wrong": n_wrong - fp - tn}),
        "refine_success": tot["refine_fixed"] / max(1, tot["refine_from_wrong"]),  # the fix rate
        "refine_break_rate": tot["refine_broken"] / max(1, tot["refine_from_right"]),
        "refine_fixed_count": tot["refine_fixed"], "refine_broken_count": tot["refine_broken"],
    } | ({} if not tot["eval_checks"] else {  # evaluator_blind: the judge's own result, before it saw the solution
        "evaluator_check_acc": tot["eval_check_right"] / tot["eval_checks"]}) \
      | ({} if not tot["probes"] else {  # the judge on its probes: near misses (wrong) and right solutions
        "probe_balanced_acc": _balanced(tot["probe_tp"], tot["probe_right"], tot["probe_tn"],
                                        tot["probes"] - tot["probe_right"]),
        "probe_fpr": tot["probe_fp"] / max(1, tot["probes"] - tot["probe_right"])})

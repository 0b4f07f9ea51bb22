"""Split information: two agents each hold half of a task's facts and the answer needs both halves (a team design
from the literature, pre-registered in docs/experiments.md; data/split_info_data.py makes the tasks). And the
one-agent baseline on the same tasks, which sees every fact.

SplitInfoEnv, roles ("agent_a", "agent_b"):
    round 1      both at once (one engine call): the question and ONLY the agent's own facts; each writes a message
                 to the other (what it knows that matters), and may already end with 'Answer: ...'
    round 2..    each continues ITS OWN chat: its reply stays verbatim, the other's latest reply arrives as a new
                 user message (so a turn extends the agent's last one token for token); it answers with
                 'Answer: ...'. `max_rounds` (default 2, at most 4) caps the rounds; past round 2 the episode ends
                 early once both answers agree (a later round only helps agents that disagree)

The team's answer is agent_a's answer in its last turn: one fixed agent, not "either one right" (that would give
the team two guesses), and not a vote (two votes tie). Which half agent_a holds is drawn per task, so choosing it
favours no half; agents_agree says how often agent_b would have given the same answer.

Rewards, per turn:
    last round   the team's correctness (1 / 0), for both agents (final_reward "team", the default). An agent_b
                 paid that is paid for agent_a's answer, which its last reply cannot change (agent_a has already
                 answered); final_reward "own" pays each agent its own answer's correctness instead (agent_a's own
                 is the team's)
    round 1      message_reward "team" (default): the team's correctness too. The message exists only for the
                 team's answer, and with algo.group_by_turn it is compared with the same agent's round-1 messages
                 of the task's other chains: those of chains whose team got it right rise. "fact" pays the message
                 1 when it carries the sender's needed fact (every key word of it, data/split_info_data.py), else 0:
                 a shaped signal read off the generator's labels, which a real task would not have, and one that
                 a message dumping every fact also earns; for the ablation, not the default. "fact_only" pays it 1
                 only when it carries the needed fact and names no other fact of the sender's (none of an unneeded
                 fact's marks: its words that no other fact of the sender's half and not the question holds, e.g.
                 a distractor's name or number), so a message listing every fact earns 0
    rounds 2..   before the last: the team's correctness
Metrics: team_reward, agents_agree (both last answers read and the same), message_has_needed_fact (the share of
the two round-1 messages carrying their sender's needed fact), message_has_unneeded_fact (the share naming a fact
of the sender's the question does not need, by its marks), no_answer (agent_a's last reply has none).

SplitInfoSingleEnv, role ("solver",): one agent sees the question and ALL the facts, in one context, and answers
in one turn; `turns=2` first writes down what matters and then, continuing its chat, answers (the team's two
rounds); every turn is paid the final answer's correctness. Metrics: team_reward, no_answer,
message_has_needed_fact (its first reply carries every needed fact).

Answers are read as the first word of the last 'Answer:' (a leading "the", "a", "an" skipped), compared with the
one-word gold answer case-insensitively: one guess, no lists. Parsers are linear in the reply and never raise.
"""
from __future__ import annotations

import re

from data.split_info_data import load_split_info
from envs import Prompt, need_choice, need_int

ROLES = ("agent_a", "agent_b")
LETTER = {"agent_a": "A", "agent_b": "B"}
MAX_MESSAGE_CHARS = 2000  # of the other's reply shown to an agent: a runaway reply does not fill its context
SYSTEM = ("You are agent {me} of a two-agent team. You and agent {other} each know different facts, and the question "
          "needs facts from both of you. Tell agent {other} what it needs from your facts, read what it tells you, "
          "and answer with one last line: 'Answer: <answer>'.")
SINGLE = "You answer questions from the facts you are given. End with one last line: 'Answer: <answer>'."
_ANSWER = re.compile(r"answer[ \t]*:", re.IGNORECASE)
_WORDS = re.compile(r"[a-z0-9]+")


def parse_answer(reply) -> str | None:
    """The first word of the text after a reply's last 'Answer:' on its line, lower case ('the', 'a', 'an'
    skipped), else None."""
    if not isinstance(reply, str):
        return None
    last = None
    for last in _ANSWER.finditer(reply):
        pass
    if last is None:
        return None
    end = reply.find("\n", last.end(), last.end() + 200)
    words = re.findall(r"\w+", reply[last.end():end if end >= 0 else last.end() + 200])
    words = words[1:] if words[:1] and words[0].lower() in ("the", "a", "an") else words
    return words[0].lower() if words else None


def is_right(answer: str | None, gold: str) -> bool:
    return answer is not None and answer == gold.strip().lower()


def carries(reply, keys: list[str]) -> bool:
    """Whether a reply holds every key word (whole words, any case): it passed that fact on."""
    words = set(_WORDS.findall(reply.lower())) if isinstance(reply, str) else set()
    return all(k.lower() in words for k in keys)


def unneeded_marks(task: dict, side: list[int]) -> list[set[str]]:
    """Per fact of `side` (fact indices) that the answer does not need: its marks, the words (lower case) that no
    other fact of `side` and not the question holds. 'Kiro has 12 coins.' beside 'Vela has 5 coins.' -> {kiro,
    12}. A fact without marks (nothing of its own to name) is left out."""
    words = {i: set(_WORDS.findall(task["facts"][i].lower())) for i in side}
    question = set(_WORDS.findall(task["question"].lower()))
    out = []
    for i in side:
        if i in task["needed"]:
            continue
        own = words[i] - question - set().union(*(words[j] for j in side if j != i))
        if own:
            out.append(own)
    return out


def _facts(task: dict, which) -> str:
    return "\n".join(f"- {task['facts'][i]}" for i in which)


def _needed_of(task: dict, side: list[int]) -> list[list[str]]:
    """The keys of the needed facts that lie in `side` (a list of fact indices)."""
    return [k for i, k in zip(task["needed"], task["keys"]) if i in side]


def solution(task: dict) -> str:
    """A perfect last reply: the needed facts, the step from them, the answer."""
    facts = " ".join(task["facts"][i] for i in task["needed"])
    return f"{facts}{' ' + task['work'] if task.get('work') else ''}\nAnswer: {task['answer']}"


class SplitInfoEnv:
    roles = ROLES

    def __init__(self, max_rounds: int = 2, message_reward: str = "team", final_reward: str = "team"):
        self.max_rounds = need_int("max_rounds", max_rounds, 2, 4)
        self.message_reward = need_choice("message_reward", message_reward, ("team", "fact", "fact_only"))
        self.final_reward = need_choice("final_reward", final_reward, ("team", "own"))

    def reset(self, task: dict):
        self.task, self.round, self.done = task, 1, False
        self.said: dict[str, list[str]] = {r: [] for r in ROLES}  # each agent's replies, by round
        self.chats = {}
        for r, side in zip(ROLES, ("facts_a", "facts_b")):
            me, other = LETTER[r], LETTER[ROLES[1 - ROLES.index(r)]]
            self.chats[r] = [{"role": "system", "content": SYSTEM.format(me=me, other=other)},
                             {"role": "user", "content": f"Question: {task['question']}\n\nYour facts (agent {other} "
                              f"knows others):\n{_facts(task, task[side])}\n\nWrite a short message to agent {other} "
                              "with your facts that the question needs. If you can already answer, end with "
                              "'Answer: <answer>'."}]
        return self._hand()

    def _hand(self) -> list[Prompt]:
        return [Prompt(r, list(self.chats[r])) for r in ROLES]

    def step(self, reply):
        if self.done:
            raise RuntimeError("step() after the episode ended")
        replies = list(reply) if isinstance(reply, (list, tuple)) else [reply]
        replies = [t if isinstance(t, str) else "" for t in (replies + ["", ""])[:2]]
        for r, text in zip(ROLES, replies):
            self.said[r].append(text)
            self.chats[r].append({"role": "assistant", "content": text})  # verbatim: the next round extends it
        answers = [parse_answer(t) for t in replies]
        agree = answers[0] is not None and answers[0] == answers[1]
        if self.round == self.max_rounds or (self.round >= 2 and agree):
            self.done = True
            return None
        self.round += 1
        last = self.round == self.max_rounds
        for r, other in zip(ROLES, reversed(ROLES)):
            heard = self.said[other][-1].strip()[:MAX_MESSAGE_CHARS]
            ask = ("Now answer the question. End with 'Answer: <answer>'." if last else
                   f"Tell agent {LETTER[other]} what it still needs, and end with 'Answer: <answer>'.")
            self.chats[r].append({"role": "user", "content": f"Agent {LETTER[other]} wrote:\n{heard}\n\n{ask}"})
        return self._hand()

    def _answer(self, role: str) -> str | None:
        return parse_answer(self.said[role][-1]) if self.said[role] else None

    def final_answer(self) -> str | None:
        """agent_a's last answer, the team's (eval.py's majority vote)."""
        return self._answer("agent_a")

    def _team(self) -> float:
        return float(is_right(self._answer("agent_a"), self.task["answer"]))

    def _side(self, role: str) -> list[int]:
        """The indices of the facts this role holds."""
        return self.task["facts_a" if role == "agent_a" else "facts_b"]

    def _message_carries(self, role: str) -> bool:
        return bool(self.said[role]) and all(carries(self.said[role][0], k) for k in _needed_of(self.task, self._side(role)))

    def _message_names_other(self, role: str) -> bool:
        """Whether the role's round-1 message names a fact of its half that the answer does not need."""
        if not self.said[role]:
            return False
        said = set(_WORDS.findall(self.said[role][0].lower()))
        return any(m & said for m in unneeded_marks(self.task, self._side(role)))

    def turn_rewards(self) -> list[float]:
        """Round by round, agent_a's turn then agent_b's (the order they were handed out)."""
        team, out = self._team(), []
        rounds = len(self.said["agent_a"])
        for k in range(rounds):
            for r in ROLES:
                if k == rounds - 1 and self.final_reward == "own":
                    out.append(float(is_right(self._answer(r), self.task["answer"])))
                elif k == 0 and k < rounds - 1 and self.message_reward != "team":
                    out.append(float(self._message_carries(r) and (self.message_reward == "fact"
                                                                   or not self._message_names_other(r))))
                else:
                    out.append(team)
        return out

    def scripted_replies(self, task: dict) -> list[str]:
        """A perfect team (sft.py's scripted teacher): in round 1 each agent passes on exactly its needed fact;
        in round 2 both write the needed facts, the step and the answer, agree, and the episode ends."""
        msg = [" ".join(task["facts"][i] for i in task["needed"] if i in task[side]) for side in ("facts_a", "facts_b")]
        return msg + [solution(task)] * 2

    def metrics(self) -> dict:
        a, b = self._answer("agent_a"), self._answer("agent_b")
        return {"team_reward": self._team(), "agents_agree": float(a is not None and a == b),
                "message_has_needed_fact": sum(self._message_carries(r) for r in ROLES) / 2,
                "message_has_unneeded_fact": sum(self._message_names_other(r) for r in ROLES) / 2,
                "no_answer": float(a is None)}


class SplitInfoSingleEnv:
    roles = ("solver",)

    def __init__(self, turns: int = 1):
        self.turns = need_int("turns", turns, 1, 2)

    def reset(self, task: dict) -> Prompt:
        self.task, self.replies = task, []
        ask = ("First write down the facts the question needs." if self.turns == 2 else
               "Answer the question. End with 'Answer: <answer>'.")
        self.chat = [{"role": "system", "content": SINGLE},
                     {"role": "user", "content": f"Question: {task['question']}\n\nFacts:\n"
                                                 f"{_facts(task, range(len(task['facts'])))}\n\n{ask}"}]
        return Prompt("solver", list(self.chat))

    def step(self, reply):
        text = reply if isinstance(reply, str) else ""
        self.replies.append(text)
        if len(self.replies) == self.turns:
            return None
        self.chat += [{"role": "assistant", "content": text},  # verbatim: the answer extends this turn
                      {"role": "user", "content": "Now answer the question. End with 'Answer: <answer>'."}]
        return Prompt("solver", list(self.chat))

    def final_answer(self) -> str | None:
        return parse_answer(self.replies[-1]) if self.replies else None

    def _team(self) -> float:
        return float(is_right(self.final_answer(), self.task["answer"]))

    def turn_rewards(self) -> list[float]:
        return [self._team()] * len(self.replies)

    def scripted_replies(self, task: dict) -> list[str]:
        """A perfect solver: under turns=2 the needed facts first; then the facts, the step and the answer."""
        return ([" ".join(task["facts"][i] for i in task["needed"])] if self.turns == 2 else []) + [solution(task)]

    def metrics(self) -> dict:
        first = self.replies[0] if self.replies else ""
        return {"team_reward": self._team(), "no_answer": float(self.final_answer() is None),
                "message_has_needed_fact": float(all(carries(first, k) for k in self.task["keys"]))}


def scripted_replies(task: dict) -> list[str]:
    """The team's perfect play at the default options (SplitInfoEnv.scripted_replies)."""
    return SplitInfoEnv().scripted_replies(task)


def load_tasks(spec: str) -> list[dict]:
    """data/split_info_{train,val,test}.jsonl, or any file of such rows (data/split_info_data.py)."""
    return load_split_info(spec)


def aggregate(episodes) -> dict:
    """The rates over the episodes that finished (an env error's has no metrics), and each role's mean generated
    tokens per turn and the team's per episode, where the turns are there (the matched-budget comparison)."""
    ms = [e.metrics for e in episodes if e.metrics and "team_reward" in e.metrics]
    out = {k: sum(m.get(k, 0.0) for m in ms) / max(1, len(ms)) for k in ("team_reward", "no_answer", "agents_agree",
                                                                         "message_has_needed_fact",
                                                                         "message_has_unneeded_fact") if any(k in m for m in ms)}
    steps = [s for e in episodes for s in getattr(e, "samples", ())]
    for role in sorted({s.role for s in steps}):
        mine = [len(s.completion_ids) for s in steps if s.role == role]
        out[f"tokens/{role}"] = sum(mine) / len(mine)
    if steps:
        out["tokens_per_episode"] = sum(len(s.completion_ids) for s in steps) / max(1, len(episodes))
    return out


def check_config(cfg, grouped: tuple) -> tuple[str, str] | None:
    """rollout.max_turns must hold every turn (a set of two past it is never handed out: every episode would end
    truncated, unpaid). The team's rounds are paid apart (a message on the team's or its own fact reward, the
    last answer on its own under final_reward "own"): no merged sequence, which would train round 1 on the last
    round's reward. The one-agent baseline's turns share one reward and may merge."""
    kw, team = cfg.data.env_kwargs, {r.name for r in cfg.roles} == set(ROLES)
    turns = 2 * kw.get("max_rounds", 2) if team else kw.get("turns", 1)
    if isinstance(turns, int) and cfg.rollout.max_turns < turns:
        return ("rollout.max_turns", f"{cfg.rollout.max_turns} is fewer than the {turns} turns an episode takes "
                f"({'2 agents x max_rounds' if team else 'turns'}): every episode would end truncated")
    if team and cfg.rollout.merge_turns:
        return ("rollout.merge_turns", "the split-information team's rounds are paid apart; merging would train each "
                "agent's message on its last turn's reward (algo.pack_turns still packs them)")
    return None


CONSOLE = ("agents_agree", "message_has_needed_fact")

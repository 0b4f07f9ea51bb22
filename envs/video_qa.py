"""Video question answering over timestamped clip captions: a text agent (captioner) and a graph
agent (grapher) report on the "video", an organizer answers the multiple-choice question. The text
side of VideoMultiAgents (its organizer answers from a video agent's, a text agent's and a graph
agent's reports), with the video given as clip captions since there is no vision model offline.

    captioner   one turn: sees the question, the choices and every clip caption; reports the clips
                that matter, citing their ids, and ends with "Choice: <letter>"
    grapher     one turn: the same view (not the captioner's report: the two work independently, so
                with `parallel` (default on) both are handed out at once and share one engine call);
                writes the scene graph that matters as triples with clip ids, "(Anna, wash, cup)
                [c4]", and links "(c4, before, c6)" / "(c2, causes, c3)", then "Choice: <letter>"
    organizer   one turn: sees the question, the choices and the shared history (both reports,
                never the captions); answers "Answer: <letter>" with a short reason. Its answer
                ends the episode.
Replies are read by agents/video_team.py (parse_choice, parse_clip_ids, parse_triples).

Agreement skip (`skip_on_agreement`, off by default): as in the published system, when the
captioner and the grapher name the same choice, the episode ends after the grapher with that
answer and no organizer turn. The agents state their choice on the "Choice:" line either way; with
the skip on, the organizer still speaks (and trains) whenever they disagree or either names none.
Off by default so that RL trains the organizer on every episode. Logged: `agree` (both named the
same choice, whether or not the skip is on) and `skipped` (the organizer's turn was skipped).

Rewards (rewards/video.py), with S the question's supporting clips and G its scene graph (every
triple of the video's gold graph whose clips all support the question):
    organizer   1 if its answer is the gold choice, else 0 (no readable answer: 0)
    captioner   F1 of the clips it cites (every clip id it writes, once each) against S:
                precision |cited ∩ S| / |cited|, recall |cited ∩ S| / |S|; 0 when it cites nothing
    grapher     F1 of its triples against G, names normalised (lower case, no articles or
                punctuation, stemmed) and the caption's verb forms mapped to the graph's (the task's
                aliases); links read in either direction ("c5 after c3" = "c3 before c5")
A question with no supporting clips (a real file without grounding) pays the captioner the team
reward; one with no scene graph (every real file) pays the grapher the team reward. The team
reward is the final answer's correctness: the organizer's, or the agents' agreed choice when the
organizer was skipped. Their stated choices are not paid for themselves.

Metrics: team_reward (= correct), cite_precision / cite_recall / cite_f1, triple_precision /
triple_recall / triple_f1, agree, skipped, no_answer, captioner_choice_correct /
grapher_choice_correct and the question type (q_temporal, q_causal, q_descriptive, q_other);
`aggregate` adds accuracy by question type (acc_<type>), agreement_rate and skip_rate, micro-averaged
citation and triple precision / recall, and mean tokens per turn of each role and per episode.

Tasks: data/video_data.load_video (our synthetic videos, or QUESTIONS@CAPTIONS[@ANSWERS] for real
NExT-QA / EgoSchema files). Config (two files: this + configs/video_qa.py): data.env =
"envs.video_qa:VideoQAEnv" with its knobs in data.env_kwargs, or the built-in name "video_qa".
"""
from __future__ import annotations

from agents.video_team import LETTERS, agent_messages, organizer_messages, parse_choice, parse_clip_ids, parse_triples
from data.video_data import load_video
from envs import Prompt, need_bool
from rewards.video import citation_counts, graph_counts, prf

ROLES = ("captioner", "grapher", "organizer")
TYPES = ("temporal", "causal", "descriptive", "other")


class VideoQAEnv:
    roles = ROLES

    def __init__(self, skip_on_agreement: bool = False, max_caption_chars: int = 6000, max_report_chars: int = 1200,
                 parallel: bool = True):
        from config import ConfigError  # a ValueError that train.py prints as one line
        if not isinstance(skip_on_agreement, bool):
            raise ConfigError("config field data.env_kwargs.skip_on_agreement: must be true or false, got "
                              f"{skip_on_agreement!r}")
        self.parallel = need_bool("parallel", parallel)  # captioner and grapher in one engine round
        for name, v, lo in (("max_caption_chars", max_caption_chars, 200), ("max_report_chars", max_report_chars, 50)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"config field data.env_kwargs.{name}: must be an integer >= {lo}, got {v!r}")
        self.skip, self.max_caption_chars, self.max_report_chars = skip_on_agreement, max_caption_chars, max_report_chars

    # ---------------------------------------------------------------------------------- the episode

    def reset(self, task):
        self.q, self.choices = str(task["question"]), [str(c) for c in task["choices"]]
        self.answer = int(task["answer"])
        self.support = list(task.get("support") or [])
        self.graph = task.get("graph") or None
        self.aliases = task.get("aliases") or {}
        self.type = task.get("type") if task.get("type") in TYPES else "other"
        self.clips = list(task["clips"])
        self.history: list[tuple[str, str]] = []  # (role, report): the shared history the organizer reads
        self.turns: list[str] = []
        self.votes: dict[str, int | None] = {}
        self.cited, self.triples = [], []
        self.final, self.organizer_choice, self.skipped, self.done = None, None, False, False
        if self.parallel:  # the two agents need nothing from each other: handed out together
            both = [self._agent_turn("captioner"), self._agent_turn("grapher")]
            self.role = "agents"
            return both
        return self._agent_turn("captioner")

    def _agent_turn(self, role):
        self.role = role
        return Prompt(role, agent_messages(role, self.q, self.choices, self.clips, self.max_caption_chars))

    def step(self, reply):
        if self.done:
            raise RuntimeError("step() after the episode ended")
        if self.role == "agents":  # parallel: [captioner's reply, grapher's reply]
            replies = list(reply) + ["", ""] if isinstance(reply, (list, tuple)) else [reply, ""]
            self._report("captioner", replies[0])
            return self._report("grapher", replies[1])
        return self._report(self.role, reply)

    def _report(self, role, reply):
        """Record one role's reply; the next turn (grapher, organizer) or None."""
        reply = reply if isinstance(reply, str) else ""
        self.turns.append(role)
        if role == "captioner":
            self.cited = parse_clip_ids(reply)
            self.votes["captioner"] = parse_choice(reply, self.choices)
            self.history.append(("captioner", reply))
            return None if self.parallel else self._agent_turn("grapher")
        if role == "grapher":
            self.triples = parse_triples(reply)
            self.votes["grapher"] = parse_choice(reply, self.choices)
            self.history.append(("grapher", reply))
            if self.skip and self.agree():
                self.final, self.skipped, self.done = self.votes["captioner"], True, True
                return None
            self.role = "organizer"
            return Prompt("organizer", organizer_messages(self.q, self.choices, self.history, self.max_report_chars))
        self.organizer_choice = self.final = parse_choice(reply, self.choices)
        self.history.append(("organizer", reply))
        self.done = True
        return None

    def agree(self) -> bool:
        a, b = self.votes.get("captioner"), self.votes.get("grapher")
        return a is not None and a == b

    # ---------------------------------------------------------------------------------- rewards

    def _scores(self):
        """Everything the rewards and metrics need, from the turns taken so far (an episode cut
        short by rollout.max_turns is scored on what it did)."""
        correct = float(self.final is not None and self.final == self.answer)
        n_cited, n_support, n_cite_hit = citation_counts(self.cited, self.support)
        n_pred, n_gold, n_hit = graph_counts(self.triples, self.graph, self.aliases) if self.graph else \
            (len(self.triples), 0, 0)
        cp, cr, cf = prf(n_cited, n_support, n_cite_hit)
        tp, tr, tf = prf(n_pred, n_gold, n_hit)
        return {"correct": correct, "cite": (cp, cr, cf), "triple": (tp, tr, tf),
                "captioner": cf if self.support else correct, "grapher": tf if self.graph else correct,
                "organizer": float(self.organizer_choice is not None and self.organizer_choice == self.answer),
                "counts": (n_cited, n_support, n_cite_hit, n_pred, n_gold, n_hit)}

    def turn_rewards(self):
        s = self._scores()
        return [s[role] for role in self.turns]

    def metrics(self):
        s = self._scores()
        n_cited, n_support, n_cite_hit, n_pred, n_gold, n_hit = s["counts"]
        return {"team_reward": s["correct"], "correct": s["correct"],
                "cite_precision": s["cite"][0], "cite_recall": s["cite"][1], "cite_f1": s["cite"][2],
                "triple_precision": s["triple"][0], "triple_recall": s["triple"][1], "triple_f1": s["triple"][2],
                "agree": float(self.agree()), "skipped": float(self.skipped), "no_answer": float(self.final is None),
                "captioner_choice_correct": float(self.votes.get("captioner") == self.answer),
                "grapher_choice_correct": float(self.votes.get("grapher") == self.answer),
                **{f"q_{t}": float(self.type == t) for t in TYPES},
                # counts, for aggregate's micro averages
                "n_cited": float(n_cited), "n_cited_support": float(n_cite_hit), "n_support": float(n_support),
                "n_triples": float(n_pred), "n_triples_right": float(n_hit), "n_gold_triples": float(n_gold)}


def aggregate(episodes) -> dict:
    """Accuracy by question type, agreement and skip rates, micro-averaged citation and triple
    precision / recall (counts summed over episodes), and mean tokens per turn of each role and per
    episode (when the episodes carry their samples: train.py's do, compare.py's replays do not)."""
    ms = [e.metrics for e in episodes if e.metrics and "n_cited" in e.metrics]
    if not ms:
        return {}
    n = len(ms)
    out = {"agreement_rate": sum(m["agree"] for m in ms) / n, "skip_rate": sum(m["skipped"] for m in ms) / n}
    for a, b, name in (("n_cited_support", "n_cited", "cite_precision_micro"),
                       ("n_cited_support", "n_support", "cite_recall_micro"),
                       ("n_triples_right", "n_triples", "triple_precision_micro"),
                       ("n_triples_right", "n_gold_triples", "triple_recall_micro")):
        out[name] = sum(m[a] for m in ms) / max(1.0, sum(m[b] for m in ms))
    for t in TYPES:
        group = [m["correct"] for m in ms if m.get(f"q_{t}")]
        if group:
            out[f"acc_{t}"] = sum(group) / len(group)
    played = [e for e in episodes if getattr(e, "samples", None)]
    for role in ROLES:
        samples = [s for e in played for s in e.samples if s.role == role]
        if samples:
            out[f"tokens/{role}"] = sum(len(s.completion_ids) for s in samples) / len(samples)
    if played:
        out["tokens/episode"] = sum(len(s.completion_ids) for e in played for s in e.samples) / len(played)
    return out


def load_tasks(spec: str) -> list[dict]:
    """Our video rows (data/video_*.jsonl) or QUESTIONS@CAPTIONS[@ANSWERS]; data/video_data.py."""
    return load_video(spec)


def scripted_replies(task) -> list[str]:
    """A perfect team's replies, in turn order (captioner, grapher, organizer): the captioner cites
    exactly the supporting clips with their captions, the grapher writes exactly the question's scene
    graph, and all three name the gold choice. sft.py's scripted teacher plays these."""
    letter = LETTERS[int(task["answer"])]
    caption = {c["id"]: " ".join(str(c["caption"])[:300].split()) for c in task["clips"]}  # a report, not a copy
    sup = list(task.get("support") or [])
    cap = "\n".join([f"[{c}] {caption[c]}" for c in sup] + [f"Choice: {letter}"])
    lines = []
    for t in task.get("graph") or []:
        lines.append(f"({t[0]}, {t[1]}, {t[2]}) [{t[3]}]" if len(t) == 4 else f"({t[0]}, {t[1]}, {t[2]})")
    graph = "\n".join(lines + [f"Choice: {letter}"])
    cites = " ".join(f"[{c}]" for c in sup)
    org = (f"Answer: {letter}\nReason: the text agent's clips{' ' + cites if cites else ''} and the scene graph "
           f"both point to \"{task['choices'][int(task['answer'])]}\".")
    return [cap, graph, org]

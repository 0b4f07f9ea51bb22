"""The episode driver: many episodes at once, every pending model turn in one engine call.

run_episodes(engine, tokenizer, make_env, tasks, roles, num_chains, max_turns): tasks x num_chains
episodes; each round every pending model turn, whatever its role, goes into ONE engine.generate
call (engines.py: TorchEngine; vllm_engine.py: VLLMEngine); replies go back through env.step. The env interface
it drives is in envs/__init__.py (reset / step / turn_rewards / metrics; Prompt(role, messages)).
A Sample is one model turn (what the role saw, said and earned); merge_turns joins a role's turns of
one episode into one training sequence when each prompt extends the last.

The engine names (TorchEngine, VLLMEngine, Request, Result, SamplingParams) are re-exported here,
so `from rollout import TorchEngine` keeps working.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import time
from dataclasses import dataclass, field

import chat
from engines import SUPPORTED, Request, Result, SamplingParams, TorchEngine  # noqa: F401 (re-exported)
from vllm_engine import VLLMEngine  # noqa: F401 (re-exported; vLLM itself is imported only when one is built)
from envs import Prompt  # noqa: F401  (re-exported: what an env hands the driver)


# --------------------------------------------------------------------------------------------
# the episode driver


@dataclass
class RoleSpec:
    adapter: str | None
    sampling: SamplingParams


@dataclass
class Sample:
    """One model turn as the trainer sees it: what the role saw, what it said, what it earned. (A
    training step is `step`; what an env hands the driver is an envs.Prompt.)"""
    episode_id: int
    task_id: int
    role: str
    turn: int  # its index in the episode
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    reward: float = 0.0
    finish_reason: str = ""
    text: str = ""  # the reply as text (the engine's decode)
    loss_mask: list[int] | None = None  # per completion token, 0 where no loss (merged turns: the gaps); None = all 1
    label: object = None  # env.turn_labels(): e.g. the truth of what a judge judged; None = unlabelled
    baseline: float | None = None  # ReMax: the greedy reply's reward to the same prompt
    dummy: bool = False  # a zero-weight row that keeps ranks in lockstep (learner.prepare_adapter)
    advantage: float | None = None  # its mean advantage, set by the learner (trajectory files)
    parts: list = field(default_factory=list, repr=False, compare=False)  # merge_turns: the turns it joined
    env_reward: float | None = None  # data.reward=calculator: the env's own reward the weighted one replaced
    reward_components: dict | None = None  # data.reward=calculator: the weighted reward's parts
    info: dict = field(default_factory=dict)  # extras: own_reward (learner.mix_team_reward) is read by the logs
    key: object = None  # its place that algo.group_by_turn compares: the env's Prompt.key, else the role's turn count

    @property
    def merged_turns(self) -> int:
        """Turns merge_turns joined into this one (1: a turn of its own)."""
        return len(self.parts) or 1


@dataclass
class Episode:
    episode_id: int
    task_id: int
    env: object
    samples: list[Sample] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    truncated: bool = False
    error: str | None = None  # the env raised: the episode ended there and earns 0
    task: dict | None = None
    fork_of: tuple[int, int, int] | None = None  # ReMax baseline fork: (episode id, first turn, turns) it replays greedily
    scored: bool = False  # tree sampling: each turn's reward was read at its node, not from turn_rewards() at the end


def run_episodes(engine, tokenizer, make_env, tasks, roles: dict[str, RoleSpec], num_chains: int = 1,
                 max_turns: int = 8, max_model_len: int | None = None, progress: bool = False,
                 seed_ids: list[int] | None = None, baseline_roles: dict[str, RoleSpec] | None = None,
                 tree: bool = False):
    """Roll out len(tasks) x num_chains episodes; returns (samples, episodes).

    Each round: every live episode's pending turns (one Prompt, or the several independent ones an env
    hands out at once) become requests (each with its role's adapter and sampling), all in ONE
    engine.generate call; replies go back through env.step (a list of replies for a list of prompts). An
    episode ends when the env says so, when its next turns would pass max_turns model turns, or when a
    prompt would not fit in max_model_len (then it is marked truncated). Rewards come from
    env.turn_rewards() at the end. An env that raises (on reset, a reply, or its rewards) ends that
    episode with reward 0 on every turn and `Episode.error` set; the other episodes go on.
    A prompt that continues an earlier turn of its episode (that turn's messages + its reply verbatim as an
    assistant message + new messages) is that turn's prompt ids + the ids the engine sampled + the chat
    template's delta (chat.continue_ids): token for token, never a re-encode of the reply.
    Seeded sampling gives episode (task t, chain c) the stream seed + f(seed_ids[t] * num_chains + c,
    turn): pass global task ids as seed_ids and a task samples the same on any rank and in any batch. The
    turns of a set handed out at once are numbered in the set's order, as if handed out one by one.

    baseline_roles (ReMax): at every sampled turn (or set) the env is copied (env.fork() if it has one,
    else copy.deepcopy) and the copy is played on with these (greedy) specs from there on; the reward the
    copy's env gives a turn is the sampled turn's baseline, `sample.baseline`. The copies ride in the
    same engine calls as the sampled episodes. A set handed out at once gets one twin, greedy for every member:
    a member's baseline then also has the others' greedy replies, not their sampled ones (unbiased, noisier
    where one member's reward depends on another's; one twin per member would cost a call per member).

    tree (AT-GRPO's tree-style sampling, arXiv 2510.11062; rollout.tree_sampling): a task's num_chains chains
    share one state (one reset; the other chains start as forks of it). At every node (a turn, or a set handed out at once) each chain samples its own candidate
    from the same prompt ids and steps its own env; the candidate's reward is read right then (the env's
    turn_rewards(), which an env with `rewards_so_far = True` gives after any step: the last entries are the
    node's turns). The best chain (the highest sum over the node's turns; the first on a tie) goes on: every
    other chain takes a fork of its env, its pending prompts and its history, so the next node's candidates
    again share one prompt. Each chain keeps its own candidates as its samples (`info["tree_best"]` marks
    the ones that went on) and the episode's metrics are the chosen path's. A chain whose env raised on its
    candidate earns 0 for it and goes on from the best one's state; when every chain's did, they all end there
    (the turns paid at earlier nodes keep their pay).
    """
    seed_ids = list(range(len(tasks))) if seed_ids is None else seed_ids
    if tree and baseline_roles is not None:
        raise ValueError("tree sampling and ReMax's greedy twins both fork episodes: use one of them")
    driver = _Driver(tokenizer, roles, baseline_roles, max_turns, max_model_len, num_chains if tree else 0)
    for t, task in enumerate(tasks):
        for c in range(num_chains):
            if tree and c:  # one state: every chain of the task starts as a fork of its first
                driver.start(None, t, task, seed_ids[t] * num_chains + c, like=len(driver.episodes) - c)
            else:
                driver.start(make_env(), t, task, seed_ids[t] * num_chains + c)
    n_main = len(driver.episodes)
    bar = None
    if progress and "progress" in inspect.signature(engine.generate).parameters:
        bar = _Progress(n_main)
    while driver.pending:
        slots, reqs = driver.requests()
        if bar is not None:
            results = bar.generate(engine, reqs)
        else:
            results = engine.generate(reqs) if reqs else []
        driver.record(slots, reqs, results)
        if bar is not None:
            bar.show(n_main - sum(1 for e in driver.pending if e < n_main))
    if bar is not None:
        bar.close()
    return driver.finish(n_main)


class _Driver:
    """run_episodes' state: every episode (the sampled ones, then ReMax's greedy twins; an episode's id is
    its index), the prompts each live episode waits on, its seed stream and its turns so far."""

    def __init__(self, tokenizer, roles: dict[str, RoleSpec], baseline_roles: dict[str, RoleSpec] | None,
                 max_turns: int, max_model_len: int | None, tree: int = 0):
        self.tokenizer, self.roles, self.baseline_roles = tokenizer, roles, baseline_roles
        self.max_turns, self.max_model_len = max_turns, max_model_len
        self.tree = tree  # tree sampling: the chains of a task (consecutive episodes, this many) share one state
        self.candidate_errors: dict[int, int] = {}  # tree sampling: episode -> its candidates whose env raised
        self.episodes: list[Episode] = []
        self.pending = {}  # episode id -> (its prompts, whether the env handed them as a list)
        self.seed_of, self.said = {}, {}  # said: episode -> its turns so far, for continuations

    def fail(self, ep, e):
        ep.error = f"{type(e).__name__}: {e}"[:500]
        self.pending.pop(ep.episode_id, None)

    def hand(self, ep, call):  # the env's next prompt(s) -> pending, or the episode ends (done, or the env raised)
        try:
            nxt = call()
        except Exception as e:  # a bad task or a buggy env costs one episode, not the run
            return self.fail(ep, e)
        if nxt is None or (isinstance(nxt, list) and not nxt):
            self.pending.pop(ep.episode_id, None)
        else:
            self.pending[ep.episode_id] = (nxt if isinstance(nxt, list) else [nxt], isinstance(nxt, list))

    def start(self, env, task_id: int, task: dict, seed: int, like: int | None = None):
        """A new episode of `task` in `env`, sampling from stream `seed`: reset, its first prompt(s) pending; or,
        with `like` (tree sampling), no env of its own yet: it starts from that episode's state."""
        ep = Episode(len(self.episodes), task_id, env, task=task, scored=bool(self.tree))
        if self.tree and like is None and not getattr(env, "rewards_so_far", False):
            raise ValueError(f"tree sampling reads each turn's reward at its node: {type(env).__name__} must set "
                             "rewards_so_far = True (its turn_rewards() valid after any step)")
        self.seed_of[ep.episode_id], self.said[ep.episode_id] = seed, []
        self.episodes.append(ep)
        if like is None:
            self.hand(ep, lambda: ep.env.reset(task))
        else:
            self.take_state(ep.episode_id, like)

    def requests(self) -> tuple[list[tuple[int, Prompt]], list[Request]]:
        """This round's requests, one per pending prompt of every live episode (and of its ReMax twin), and
        slots[i] = (episode id, the Prompt) of requests[i]. An episode whose next turns would pass max_turns,
        or one of whose prompts would not fit in max_model_len, ends here, truncated."""
        slots, reqs = [], []
        for eid, (prompts, _) in list(self.pending.items()):
            ep = self.episodes[eid]
            for p in prompts:
                if p.role not in self.roles:
                    raise KeyError(f"env asked for role {p.role!r}; configured roles are {sorted(self.roles)}")
            specs = [(self.baseline_roles if ep.fork_of else self.roles)[p.role] for p in prompts]
            ids, taken = [], set()
            for p in prompts:
                x, i = prompt_ids(self.tokenizer, p.messages, self.said[eid], taken)
                ids.append(x)
                taken.add(i)
            if len(ep.samples) + len(prompts) > self.max_turns or (self.max_model_len is not None and any(
                    len(x) + s.sampling.max_new_tokens > self.max_model_len for x, s in zip(ids, specs))):
                ep.truncated = True
                del self.pending[eid]
                continue
            if self.baseline_roles is not None and ep.fork_of is None:  # ReMax: a greedy twin from these turns on
                self.fork(ep, prompts, ids, slots, reqs)
            for j, (x, p, spec) in enumerate(zip(ids, prompts, specs)):
                sp = spec.sampling
                if sp.seed is not None:  # distinct but reproducible stream per episode and turn
                    sp = dataclasses.replace(sp, seed=(sp.seed + 1000003 * self.seed_of[eid] + len(ep.samples) + j) % 2**63)
                slots.append((eid, p))
                reqs.append(Request(x, spec.adapter, sp))
        return slots, reqs

    def fork(self, ep: Episode, prompts: list[Prompt], ids: list[list[int]], slots: list, reqs: list):
        """ReMax: a copy of `ep` (its env forked) that plays on greedily from these prompts; its requests
        join this round's (slots, reqs)."""
        eid = ep.episode_id
        twin = Episode(len(self.episodes), ep.task_id, ep.env.fork() if hasattr(ep.env, "fork")
                       else copy.deepcopy(ep.env), samples=[dataclasses.replace(x) for x in ep.samples],
                       fork_of=(eid, len(ep.samples), len(prompts)))
        self.seed_of[twin.episode_id], self.said[twin.episode_id] = self.seed_of[eid], list(self.said[eid])
        self.episodes.append(twin)
        self.pending[twin.episode_id] = self.pending[eid]
        slots += [(twin.episode_id, p) for p in prompts]
        reqs += [Request(x, self.baseline_roles[p.role].adapter, self.baseline_roles[p.role].sampling)
                 for x, p in zip(ids, prompts)]

    def record(self, slots, reqs: list[Request], results: list[Result]):
        """Each reply as its episode's next Sample; then every episode that replied hands its replies (a list
        for prompts handed out as a list) to its env, which hands out the next prompt(s) or ends it."""
        replies = {}  # episode -> its replies this round, in its prompts' order
        for (eid, p), req, res in zip(slots, reqs, results):
            ep = self.episodes[eid]
            key = getattr(p, "key", None)
            key = sum(x.role == p.role for x in ep.samples) if key is None else key
            ep.samples.append(Sample(eid, ep.task_id, p.role, len(ep.samples), req.prompt_ids, res.completion_ids,
                                     res.logprobs, finish_reason=res.finish_reason, text=res.text, key=key))
            self.said[eid].append((p.messages, req.prompt_ids, res.completion_ids, res.text))
            replies.setdefault(eid, []).append(res.text)
        for eid, texts in replies.items():
            many = self.pending[eid][1]
            self.hand(self.episodes[eid], lambda: self.episodes[eid].env.step(texts if many else texts[0]))
        if self.tree:
            for first in sorted({eid - eid % self.tree for eid in replies}):
                self.node([e for e in range(first, first + self.tree) if e in replies], replies)

    def node(self, members: list[int], replies: dict):
        """Tree sampling: one node of a task's tree. Each member's candidate (its last len(replies) turns) is
        paid what its own env's turn_rewards() says now; the best member goes on, the others take its state.
        A candidate whose env raised (on its step, or on its rewards) earns 0, noted in its info and counted in
        its chain's `candidate_errors`; when every candidate did, the task's chains end with that error."""
        score, failed = {}, {}
        for eid in members:
            ep, k = self.episodes[eid], len(replies[eid])
            try:
                if ep.error:
                    raise _Raised(ep.error)
                rewards = _turn_rewards(ep)
                labels = list(ep.env.turn_labels()) if hasattr(ep.env, "turn_labels") else []
            except Exception as e:
                failed[eid] = str(e) if isinstance(e, _Raised) else f"{type(e).__name__}: {e}"[:500]
                for st in ep.samples[-k:]:
                    st.reward, st.info["env_error"] = 0.0, failed[eid]
                self.candidate_errors[eid] = self.candidate_errors.get(eid, 0) + 1
                continue
            for i, st in enumerate(ep.samples[-k:], len(ep.samples) - k):
                st.reward = rewards[i]
                if i < len(labels) and labels[i] is not None:
                    st.label = labels[i]
            score[eid] = sum(rewards[-k:])
        if not score:  # no candidate to go on from: every chain of the task ends here, with its error
            for eid in members:
                ep = self.episodes[eid]
                ep.error = failed[eid]
                self.pending.pop(eid, None)
            return
        best = max(score, key=lambda e: (score[e], -e))
        for eid in members:
            for st in self.episodes[eid].samples[-len(replies[eid]):]:
                st.info["tree_best"] = eid == best
            if eid != best:
                self.take_state(eid, best)

    def take_state(self, eid: int, src_id: int):
        """Tree sampling: episode eid goes on from episode src_id's state: a fork of its env, its pending prompts
        and its turns so far (for token-exact continuations), or its error; its own samples stay."""
        ep, src = self.episodes[eid], self.episodes[src_id]
        ep.env = src.env.fork() if hasattr(src.env, "fork") else copy.deepcopy(src.env)
        ep.error, self.said[eid] = src.error, list(self.said[src_id])
        if src_id in self.pending:
            self.pending[eid] = self.pending[src_id]
        else:
            self.pending.pop(eid, None)

    def finish(self, n_main: int) -> tuple[list[Sample], list[Episode]]:
        """Every episode's rewards (_finish), each twin's as its original's baselines; -> (samples, episodes)
        of the first n_main (the sampled episodes)."""
        for ep in self.episodes:
            _finish(ep)
            if ep.scored:  # tree sampling: this chain's candidates whose env raised (they earned 0)
                ep.metrics["candidate_errors"] = float(self.candidate_errors.get(ep.episode_id, 0))
            if ep.fork_of is not None:  # report the greedy replies' rewards to the turns they replay
                eid, k, n = ep.fork_of
                for i in range(k, k + n):
                    self.episodes[eid].samples[i].baseline = ep.samples[i].reward
        main = self.episodes[:n_main]
        return [s for ep in main for s in ep.samples], main


class _Raised(Exception):
    """An env error already recorded on its episode (its text kept as it is)."""


class _Progress:
    """run_episodes' progress bar: episodes done, and inside each engine call its decode steps with an ETA (a
    batched call finishes its episodes together, so the episode count alone sits at 0 for minutes)."""

    def __init__(self, n_main: int):
        from tqdm import tqdm
        self.bar = tqdm(total=n_main, desc="episodes", leave=False)
        self.round, self.n_reqs, self.call_t0, self.n_turns, self.n_tok = 0, 0, 0.0, 0, 0

    def generate(self, engine, reqs: list[Request]) -> list[Result]:
        """One round's engine call, ticking the bar as it decodes."""
        self.round, self.n_reqs, self.call_t0 = self.round + 1, len(reqs), time.perf_counter()
        results = engine.generate(reqs, progress=self.tick) if reqs else []
        self.n_turns, self.n_tok = self.n_turns + len(results), self.n_tok + sum(len(r.completion_ids) for r in results)
        return results

    def tick(self, done, total):
        dt = time.perf_counter() - self.call_t0
        eta = dt / max(done, 1) * (total - done)
        self.bar.set_postfix_str(f"round {self.round}: {self.n_reqs} turns, token {min(done, total)}/{total}, "
                                 f"ETA {eta:.0f}s | {self.n_turns} turns, {self.n_tok} tokens done", refresh=True)

    def show(self, n_done: int):
        self.bar.n = n_done
        self.bar.refresh()

    def close(self):
        self.bar.close()


def prompt_ids(tokenizer, messages: list[dict], earlier: list[tuple], taken=()) -> tuple[list[int], int | None]:
    """A prompt's ids and the index of the earlier turn it continues: the longest (then the latest) earlier turn of
    its episode that it continues and that no other prompt of its set took (chat.continue_ids: that turn's prompt
    ids + its sampled ids + the template's delta), else the whole prompt encoded (chat.chat_ids) and None.
    earlier: (messages, prompt ids, completion ids, reply text) per turn. A debate's solvers see one prompt in
    round 1; each revision continues its own turn, not a twin that wrote the same text in other tokens."""
    for i in sorted(range(len(earlier)), key=lambda i: (-len(earlier[i][0]), -i)):
        prev, ids, completion, text = earlier[i]
        if i not in taken and len(prev) < len(messages) and \
                (out := chat.continue_ids(tokenizer, prev, ids, completion, text, messages)):
            return out, i
    return chat.chat_ids(tokenizer, messages), None


def _turn_rewards(ep: Episode) -> list[float]:
    """The env's turn_rewards(), one float per turn played so far (a ValueError naming the env otherwise)."""
    rewards = [float(r) for r in ep.env.turn_rewards()]
    if len(rewards) != len(ep.samples):
        raise ValueError(f"{type(ep.env).__name__}.turn_rewards() gave {len(rewards)} rewards for "
                         f"{len(ep.samples)} turns (episode {ep.episode_id})")
    return rewards


def _finish(ep: Episode):
    """After its last turn: each turn's reward, the episode's metrics and the turns' labels from the env.
    An env that raises here (or raised before) gives reward 0 on every turn and sets Episode.error."""
    rewards = []
    try:
        rewards = [] if ep.error else [st.reward for st in ep.samples] if ep.scored else _turn_rewards(ep)
        ep.metrics = {} if ep.error else dict(ep.env.metrics())
        labels = ep.env.turn_labels() if not ep.error and not ep.scored and hasattr(ep.env, "turn_labels") else []
        for st, lab in zip(ep.samples, labels):
            if lab is not None:
                st.label = lab  # the trainer leaves out groups whose labels all agree
    except Exception as e:
        ep.error = f"{type(e).__name__}: {e}"[:500]
    if ep.error:  # tree sampling: the turns paid at a node that chose a best keep their pay
        rewards = [st.reward if ep.scored and "tree_best" in st.info else 0.0 for st in ep.samples]
        ep.metrics = {"env_error": 1.0}
    for st, r in zip(ep.samples, rewards):
        st.reward = r


def merge_turns(samples: list[Sample]) -> list[Sample]:
    """Merge the turns of one role in one episode into training sequences, where they extend one another.

    A turn is merged into an earlier merged sequence of the same role and episode (other roles may have
    spoken in between; several sequences may be open, e.g. researchers working sub-questions side by side)
    when its prompt starts with that sequence's tokens (prompt + completion): its conversation continued
    token for token (chat.continue_ids). The tokens in between (tool observations, other roles' turns,
    template tokens) join the completion with loss mask 0 and logprob 0; the merged sample keeps the later
    turn's reward (and ReMax baseline): the conversation trains as one sequence on its last turn's reward,
    so a layout whose turns are paid apart (the per-role chats of the math team or SWE, a debate's rounds)
    refuses merge_turns in its check_config. Turns that do not extend (a template that rewrites history, role
    prompts that differ turn by turn) stay separate samples: `merged_turns` counts what was merged. Every
    sample returned is a new Sample whose `parts` are the episode's turns it joined: the learner writes its
    mean advantage back to them, which is what the trajectory files show.
    """
    out: list[Sample] = []
    open_: dict[tuple[int, str], list[Sample]] = {}  # (episode, role) -> that role's merged sequences so far
    for s in samples:
        fits = [c for c in open_.get((s.episode_id, s.role), ())
                if len(s.prompt_ids) >= len(c.prompt_ids) + len(c.completion_ids)
                and s.prompt_ids[:len(c.prompt_ids)] == c.prompt_ids
                and s.prompt_ids[len(c.prompt_ids):len(c.prompt_ids) + len(c.completion_ids)] == c.completion_ids]
        if fits:
            cur = max(fits, key=lambda c: len(c.prompt_ids) + len(c.completion_ids))
            gap = s.prompt_ids[len(cur.prompt_ids) + len(cur.completion_ids):]
            cur.loss_mask = ((cur.loss_mask or [1] * len(cur.completion_ids)) + [0] * len(gap)
                             + (s.loss_mask or [1] * len(s.completion_ids)))
            cur.parts.append(s)
            for k in ("label", "baseline", "env_reward", "reward_components"):  # the last turn's, as its reward
                if getattr(s, k) is not None:
                    setattr(cur, k, getattr(s, k))
            cur.info = {**cur.info, **s.info}
            cur.completion_ids = cur.completion_ids + gap + s.completion_ids
            cur.logprobs = cur.logprobs + [0.0] * len(gap) + s.logprobs
            cur.reward, cur.finish_reason = s.reward, s.finish_reason
            continue
        new = dataclasses.replace(s, info=dict(s.info), loss_mask=None if s.loss_mask is None else list(s.loss_mask),
                                  parts=[s])
        open_.setdefault((s.episode_id, s.role), []).append(new)
        out.append(new)
    return out

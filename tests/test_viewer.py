"""What a researcher sees of a run: progress bars and the ETA, the wandb episode table, the
trajectory viewer (console filters) and its static HTML page, rendered in real headless Chromium."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import trajectories

ROOT = Path(__file__).resolve().parent.parent
# one worker runs this file: its module fixture (a real run, ~20 s) is then built once, not on every worker
pytestmark = pytest.mark.xdist_group("viewer")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real 3-role tiny run: 2 steps, eval at 0, 1 and 2, progress bars on, wandb offline."""
    out = tmp_path_factory.mktemp("view") / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny_math_3agent.py", "--trainer.output-dir",
                        str(out), "--trainer.total-steps", "2", "--trainer.test-freq", "1", "--trainer.save-freq", "0",
                        "--trainer.val-before-train", "--rollout.progress", "--data.val-size", "6",
                        "--trainer.trajectory-sample", "1.0", "--trainer.logger", "console", "wandb"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r.stdout, r.stderr


def test_this_files_tests_share_one_worker(request):
    """pytest.ini's --dist loadgroup sends the tests of an xdist_group to one worker (this file's, so its module
    fixture runs once; test_vllm's, so one engine is in memory at a time): xdist tags each node id with its group.
    Under pytest 9 the tag silently never happened (pytest-xdist 3.8 writes a node attribute pytest 9 no longer
    reads) and each group's tests went to every worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not on a pytest-xdist worker")
    assert request.config.getvalue("loadgroup") and request.node.nodeid.endswith("@viewer"), request.node.nodeid


def test_progress_bars_and_eta(run):
    _, stdout, stderr = run
    assert "step 1 update" in stderr and "step 2 update" in stderr  # the update's bar, per step
    assert stderr.count("episodes") >= 5  # rollout bars: 2 steps + 3 evals
    steps = [ln for ln in stdout.splitlines() if ln.startswith("[step ") and "WARNING" not in ln]
    assert len(steps) == 2 and all(" | ETA " in ln for ln in steps) and steps[-1].endswith("ETA 0s")


def test_progress_off_prints_no_bars(tmp_path):
    r = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny_toy.py", "--trainer.output-dir",
                        str(tmp_path / "r"), "--trainer.total-steps", "1", "--rollout.no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0 and "update" not in r.stderr and "episodes:" not in r.stderr, r.stderr


def test_wandb_gets_a_table_of_episodes_per_eval(run):
    out, _, _ = run
    tables = sorted((out / "wandb").glob("offline-run-*/files/media/table/val/episodes_*.table.json"))
    assert len(tables) == 3, tables  # evals at steps 0, 1, 2
    t = json.loads(tables[-1].read_text())
    assert t["columns"] == ["step", "task_id", "role", "prompt", "reply", "reward"]
    val = trajectories.read(out / "trajectories" / "val_step_000002.jsonl")
    want = [[2, r["task_id"], x["role"], x["prompt"][-2000:], x["reply"], x["reward"]] for r in val[:4] for x in r["turns"]]
    assert t["data"] == want


def test_viewer_filters_episodes(run):
    out, _, _ = run
    records = trajectories.read(out / "trajectories")
    assert {r["split"] for r in records} == {"train", "val"} and {r["step"] for r in records} == {0, 1, 2}
    assert trajectories.select(records, step=1, split="val") == [r for r in records if r["step"] == 1 and r["split"] == "val"]
    evals = trajectories.select(records, role="evaluator_critique")
    assert evals and all(any(t["role"] == "evaluator_critique" for t in r["turns"]) for r in evals)
    hi = trajectories.select(records, min_reward=0.5)
    assert all(r["metrics"]["team_reward"] >= 0.5 for r in hi)
    assert len(hi) + len(trajectories.select(records, max_reward=0.49999)) == len(records)
    cli = subprocess.run([sys.executable, "trajectories.py", str(out), "--step", "2", "--split", "val", "--limit", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    n = len(trajectories.select(records, step=2, split="val"))
    assert cli.startswith(f"{n} of {len(records)} episodes match") and cli.count("(val step 2)") == 2
    bad = out.parent / "bad.jsonl"
    bad.write_text('{"split": "val", "turns": []}\n{not json\n')
    err = subprocess.run([sys.executable, "trajectories.py", str(bad)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert err.returncode != 0 and "bad.jsonl:2" in err.stderr


def shown(dom: str) -> int:
    """Episodes the page rendered (its script's own source does not match: no digit after the quote)."""
    return len(re.findall(r'<details class="episode" data-role-reward="[-0-9]', dom))


def _chromium(*args, timeout=120):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Chromium (.ci/run installs Debian's chromium)")
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_html_page_renders_curves_and_filters_episodes_in_chromium(run, tmp_path):
    out, _, _ = run
    page = trajectories.write_html(out)
    records = trajectories.read(out / "trajectories")
    url = page.resolve().as_uri()
    r = _chromium(f"--user-data-dir={tmp_path / 'u1'}", "--dump-dom", url + "#split=val&step=2")
    dom = r.stdout
    assert shown(dom) == len(trajectories.select(records, step=2, split="val")) > 0, r.stderr[-2000:]
    assert f"of {len(records)} episodes" in dom
    for split in ("train", "val"):  # one curve per role and the team, per split
        for role in ("generator_initial", "evaluator_critique", "generator_refinement", "team"):
            assert f'data-split="{split}"' in dom and f'data-role="{role}"' in dom
    for split in ("train", "val"):  # equal curves (the team's is often the generator's) drawn apart, not on top
        svg = re.search(rf'<svg class="curves" data-split="{split}".*?</svg>', dom, re.S).group(0)
        pts = re.findall(r'<polyline class="series" data-role="[^"]+" points="([^"]+)"', svg)
        assert len(pts) == 4 and len(set(pts)) == 4
    dom = _chromium(f"--user-data-dir={tmp_path / 'u2'}", "--dump-dom", url + "#role=evaluator_critique").stdout
    n = len(trajectories.select(records, role="evaluator_critique"))
    assert shown(dom) == n and f"{n} of {len(records)} episodes" in dom
    assert dom.count('<span class="role">generator_initial') == 0  # only the chosen role's turns are shown
    pages = trajectories.read(out / "trajectories")
    newest = sorted(pages, key=lambda r: r["step"], reverse=True)
    html_text = page.read_text()
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', html_text, re.S).group(1))
    assert [e["step"] for e in data] == [e["step"] for e in newest]  # newest episodes first
    shot = tmp_path / "view.png"
    _chromium(f"--user-data-dir={tmp_path / 'u3'}", "--window-size=1100,900", f"--screenshot={shot}", url)
    from PIL import Image
    img = Image.open(shot).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20)
    assert img.size == (1100, 900) and len(colors) > 20  # drawn, not blank


# ---------------------------------------------------------------------------------- hostile files

GOOD = {"split": "val", "step": 1, "task_id": 3, "task": {"question": "2+2?"}, "metrics": {"team_reward": 1.0},
        "turns": [{"role": "solver", "prompt": "p", "reply": "4", "reward": 1.0, "reply_tokens": 1, "finish_reason": "stop"}]}


def _turn(**kw):
    return {**GOOD, "turns": [{**GOOD["turns"][0], **kw}]}


# name -> (the bad line, what the error says): every field a reader uses, each of the wrong type
MALFORMED = {
    "not UTF-8": (b'{"turns": [\xff\xfe]}', "not UTF-8"),
    "bad JSON": (b"{not json", "bad JSON"),
    "100k-deep nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "a JSON list": (b"[1, 2]", "a JSON list"),
    "a JSON string": (b'"x"', "a JSON str"),
    "no turns": (json.dumps({"split": "val"}).encode(), "field 'turns'"),
    "turns a number": (json.dumps({**GOOD, "turns": 3}).encode(), "field 'turns'"),
    "a turn that is a number": (json.dumps({**GOOD, "turns": [1]}).encode(), r"turns\[0\] is not an object"),
    "no role": (json.dumps({**GOOD, "turns": [{"reply": "x"}]}).encode(), r"turns\[0\]\.role"),
    "reply a number": (json.dumps(_turn(reply=5)).encode(), r"turns\[0\]\.reply"),
    "reward a string": (json.dumps(_turn(reward="high")).encode(), r"turns\[0\]\.reward"),
    "reward NaN": (json.dumps(_turn(reward=float("nan"))).encode(), r"turns\[0\]\.reward"),
    "reward true": (json.dumps(_turn(reward=True)).encode(), r"turns\[0\]\.reward"),
    "advantage a string": (json.dumps(_turn(advantage="x")).encode(), r"turns\[0\]\.advantage"),
    "reply_tokens a string": (json.dumps(_turn(reply_tokens="<img src=x onerror=alert(1)>")).encode(),
                              r"turns\[0\]\.reply_tokens"),
    "prompt a list": (json.dumps(_turn(prompt=[1])).encode(), r"turns\[0\]\.prompt"),
    "finish_reason a number": (json.dumps(_turn(finish_reason=1)).encode(), r"turns\[0\]\.finish_reason"),
    "step a string": (json.dumps({**GOOD, "step": "2"}).encode(), "field 'step'"),
    "split a number": (json.dumps({**GOOD, "split": 1}).encode(), "field 'split'"),
    "task_id an object": (json.dumps({**GOOD, "task_id": {"a": 1}}).encode(), "field 'task_id'"),
    "task a list": (json.dumps({**GOOD, "task": [1]}).encode(), "field 'task'"),
    "metrics a string": (json.dumps({**GOOD, "metrics": "x"}).encode(), "field 'metrics'"),
    "team_reward a string": (json.dumps({**GOOD, "metrics": {"team_reward": "1"}}).encode(), "team_reward"),
    # round 3: each of these ended in a traceback (OverflowError, UnicodeEncodeError, ValueError, TypeError)
    "a 400-digit reward": (json.dumps(_turn(reward=10 ** 400)).encode(), r"turns\[0\]\.reward"),
    "a 400-digit metric": (json.dumps({**GOOD, "metrics": {"team_reward": 1.0, "tool_calls": 2, "tool_errors": 10 ** 400}}
                                      ).encode(), "metrics.tool_errors"),
    "a 400-digit token count": (json.dumps(_turn(reply_tokens=10 ** 400)).encode(), r"turns\[0\]\.reply_tokens"),
    "a 5000-digit integer": (json.dumps(_turn(reward=7)).replace("7", "7" * 5000).encode(), "bad JSON: Exceeds the limit"),
    "a lone surrogate in a reply": (json.dumps(_turn(reply="ok \ud800")).encode(), r"turns\[0\]\.reply is not Unicode"),
    "a lone surrogate in a role": (json.dumps(_turn(role="solver\udfff")).encode(), r"turns\[0\]\.role is not Unicode"),
    "a lone surrogate in a task": (json.dumps({**GOOD, "task": {"question": "\udc80"}}).encode(), "task.question is not"),
    "tool_errors a string": (json.dumps({**GOOD, "metrics": {"team_reward": 1.0, "tool_calls": 2, "tool_errors": "many"}}
                                        ).encode(), "metrics.tool_errors"),
    "a clip id that is a list": (json.dumps({**GOOD, "task": {"question": "q", "clips": [{"id": ["c1"]}]}}).encode(),
                                 r"task\.clips\[0\]\.id"),
    "tool_errors null": (json.dumps({**GOOD, "metrics": {"tool_calls": 2, "tool_errors": None}}).encode(), "metrics.tool_errors"),
    "clips a number": (json.dumps({**GOOD, "task": {"question": "q", "clips": 5}}).encode(), "task.clips"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_every_trajectory_reader_gives_one_line_on_a_malformed_file(case, tmp_path):
    """The console viewer, the HTML page, the reward statistics and SFT: one line naming file:line and
    the field, never a traceback (before: 14 of 16 such files ended in a traceback in the viewer)."""
    import sft
    from rewards import calculator
    line, why = MALFORMED[case]
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    f = run / "trajectories" / "val_step_000001.jsonl"
    f.write_bytes(json.dumps(GOOD).encode() + b"\n" + line + b"\n")
    want = re.compile(rf"^error: .*val_step_000001\.jsonl:2: .*{why}")
    for call in (lambda: trajectories.main([str(f)]), lambda: trajectories.main([str(run)]),
                 lambda: trajectories.main([str(run), "--html"]), lambda: calculator.main(["--stats", str(f)])):
        with pytest.raises(SystemExit) as e:
            call()
        msg = str(e.value.code)
        assert want.match(msg) and "\n" not in msg, (case, msg[:300])
    with pytest.raises(trajectories.TrajectoryError, match=rf"val_step_000001\.jsonl:2: .*{why}"):
        sft.run_sft(sft.SFTConfig(data=(str(f),), out=str(tmp_path / "sft")))
    assert not (run / "view.html").exists()


def test_readers_open_regular_files_only(tmp_path):
    """A FIFO named x.jsonl hung the viewer; a link to /dev/zero ended in MemoryError; a file past the cap is
    refused unread. Each is one line naming the file, in the console viewer and the HTML page."""
    cases = {"fifo": lambda p: os.mkfifo(p), "zero": lambda p: p.symlink_to("/dev/zero")}
    for name, make in cases.items():
        run = tmp_path / name
        (run / "trajectories").mkdir(parents=True)
        make(run / "trajectories" / "x.jsonl")
        for args in ([str(run)], [str(run), "--html"]):
            r = subprocess.run([sys.executable, "trajectories.py", *args], cwd=ROOT, capture_output=True, text=True,
                               timeout=60, check=False)
            assert r.returncode != 0 and r.stderr.strip().splitlines() == [
                f"error: {run / 'trajectories' / 'x.jsonl'}: not a regular file ({'a FIFO' if name == 'fifo' else 'a device'}); refused"], r.stderr
        assert not (run / "view.html").exists()
    ok = tmp_path / "ok"  # a FIFO as metrics.jsonl (what the page's curves read) is refused too
    trajectories.write(ok / "trajectories" / "val_step_000001.jsonl", [GOOD])
    os.mkfifo(ok / "metrics.jsonl")
    with pytest.raises(SystemExit, match=r"metrics\.jsonl: not a regular file \(a FIFO\)"):
        trajectories.main([str(ok), "--html"])
    f = ok / "trajectories" / "val_step_000001.jsonl"
    with pytest.raises(trajectories.TrajectoryError, match=r"larger than 10 bytes"):
        trajectories.read_bytes(f, cap=10)
    assert trajectories.read_bytes(f, cap=f.stat().st_size) == f.read_bytes()


def test_html_page_of_a_run_with_overflowing_numbers_and_a_non_utf8_name(tmp_path):
    """A 400-digit number in metrics.jsonl (value or step) was an OverflowError in --html; so was a run directory
    whose name is not UTF-8 (UnicodeEncodeError writing the page's title): they are left out / shown as U+FFFD."""
    run = Path(os.fsdecode(bytes(tmp_path) + b"/run\xff"))
    trajectories.write(run / "trajectories" / "val_step_000001.jsonl", [GOOD])
    rows = [{"step": 1, "val/team_reward": 0.5, "val/reward/solver": 10 ** 400}, {"step": 10 ** 400, "val/team_reward": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run([sys.executable, "trajectories.py", run, "--html"], cwd=ROOT, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.decode().strip().endswith("run\ufffd/view.html"), r.stderr[-2000:]
    page = (run / "view.html").read_text(encoding="utf-8")
    assert "run\ufffd" in page and "1" + "0" * 50 not in page  # the curves hold the finite numbers only
    assert trajectories._metric_rows(run / "metrics.jsonl") == [{"step": 1, "val/team_reward": 0.5}]


def test_full_view_of_a_record_with_only_the_required_fields(tmp_path):
    """check_record lets optional fields be missing; --full read t['reward'] and ended in a KeyError."""
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"turns": [{"role": "solver", "reply": "4"}]}) + "\n")
    full = subprocess.run([sys.executable, "trajectories.py", str(bare), "--full"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert full.returncode == 0 and "--- [solver] reward None · None tokens · None" in full.stdout, full.stderr


def test_readers_cli_one_line_not_a_traceback(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_bytes(MALFORMED["100k-deep nesting"][0] + b"\n")
    for cmd in (["trajectories.py", str(f)], ["sft.py", "--data", str(f), "--out", str(tmp_path / "o")],
                ["-m", "rewards.calculator", "--stats", str(f)]):
        r = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines()[-1].startswith("error: ") and "t.jsonl:1" in r.stderr


# A model's reply, and every field a crafted file can hold, that would run script or blank the page
HOSTILE_TEXT = ("<!--<script>", "</script><script>document.title='pwned-1'</script>",
                "<img src=x onerror=\"document.title='pwned-2'\">", "\u2028\u2029", "&amp; & <b>bold</b>",
                "]]></script><!--", "<svg onload=\"document.title='pwned-3'\">")


def _hostile_records():
    recs = []
    for i, h in enumerate(HOSTILE_TEXT):
        recs.append({"split": "val" if i % 2 else h, "step": i, "task_id": h, "episode_id": i,
                     "task": {"question": h}, "metrics": {"team_reward": 1.0, h: 1.0},
                     "turns": [{"role": h, "prompt": h, "reply": h, "reward": 0.5, "advantage": 0.1, "reply_tokens": 3,
                                "finish_reason": h}]})
    return recs


@pytest.mark.parametrize("source", ["trajectory file", "any JSON (fields of every type)"])
def test_html_page_shows_hostile_fields_as_text_in_chromium(source, tmp_path):
    """`<!--<script>` in one reply blanked the whole page (only `</` was escaped), and a string task_id
    or reply_tokens in a crafted file ran script: every field reaches the page as text."""
    recs = _hostile_records()
    if source == "trajectory file":
        run = tmp_path / "run"
        trajectories.write(run / "trajectories" / "val_step_000001.jsonl", recs)
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/team_reward": 0.5, "val/reward/<b>x": 0.2}) +
                                           "\n" + json.dumps({"step": "<script>", "val/team_reward": "<x>"}) + "\n[1]\n")
        page = trajectories.write_html(run)
    else:  # what the page's script does with types the reader refuses (defence in depth)
        recs += [{**recs[2], "task_id": {"x": "<img src=x onerror=\"document.title='pwned-4'\">"}, "step": "<b>",
                  "turns": [{"role": 1, "reply": None, "reward": "<img src=x onerror=\"document.title='pwned-5'\">",
                             "advantage": [1], "reply_tokens": "<img src=x onerror=\"document.title='pwned-6'\">",
                             "prompt": {"a": 1}, "finish_reason": 2}, 7]}, {"turns": "x"}, {}]
        page = tmp_path / "view.html"
        page.write_text(trajectories.page_html(recs, [], "<script>t</script>"), encoding="utf-8")
    r = _chromium(f"--user-data-dir={tmp_path / 'u'}", "--virtual-time-budget=3000", "--dump-dom",
                  page.resolve().as_uri() + "#open=99")
    dom = r.stdout
    assert f"{len(recs)} of {len(recs)} episodes" in dom, r.stderr[-2000:]
    assert shown(dom) == len(recs) and "pwned" not in dom.split("</title>")[0]
    assert "<img" not in dom and "<svg onload" not in dom and "<b>" not in dom.split("<body>")[1]
    if source == "trajectory file":
        assert dom.count("&lt;img src=x onerror=") >= 5 and dom.count("&lt;!--&lt;script&gt;") >= 4


def test_readers_do_not_reserve_the_cap_under_an_address_space_limit(tmp_path):
    """read_bytes read f.read(MAX_FILE_BYTES + 1): 1 GiB reserved for every file, so under `ulimit -v` (usual on
    shared clusters) the viewer and --html died with MemoryError on a file of one line. It sizes the read by fstat."""
    run = tmp_path / "run"
    trajectories.write(run / "trajectories" / "val_step_000001.jsonl", [GOOD])
    limit = ("import resource, sys; vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize'))"
             ".split()[1]) * 1024; resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20),) * 2); "
             "sys.argv = ['trajectories.py', *sys.argv[1:]]; import runpy; runpy.run_path('trajectories.py', "
             "run_name='__main__')")
    for args in ([str(run)], [str(run), "--html"]):
        r = subprocess.run([sys.executable, "-c", limit, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           check=False)
        assert r.returncode == 0 and "MemoryError" not in r.stderr, r.stderr[-2000:]
    assert (run / "view.html").stat().st_size > 0

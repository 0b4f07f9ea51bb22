"""The sandbox attacked for real: every attack must fail, score 0 with a reason, leave this
(trainer) process running and the host unchanged. And code rewards that cannot be forged."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.sandbox import run_python
from rewards.code import run_tests

SECRET = "troupe-secret-4242"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A host directory with files to protect, a live loopback listener, and a secret in our env."""
    d = tmp_path_factory.mktemp("host")
    (d / "keep.txt").write_text("precious")
    os.environ["WANDB_API_KEY"] = SECRET
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield d, s.getsockname()[1]
    s.close()


def snapshot(d: Path):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*"))


ATTACKS = {  # category: [code ...]; {d} = the protected host dir, {port} = a live listener, {pid} = us
    "escape the guard": [
        "import ctypes; libc = ctypes.CDLL(None); print(libc.setns(0, 0), libc.unshare(0x40000000))\nopen('{d}/x', 'w')",
        "import _xxsubinterpreters as s; i = s.create(); s.run_string(i, \"open('{d}/x', 'w')\")",
        "import os; os.system('echo pwned > {d}/x')",
        "import os; os.execv('/bin/sh', ['sh', '-c', 'echo pwned > {d}/x'])",
        "import _posixsubprocess, os; print(os.listdir('/root'))",
    ],
    "write/delete outside": [
        "open('{d}/x', 'w').write('x')",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.open('x', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.unlink('keep.txt', dir_fd=fd)",
        "import os; os.rename('{d}/keep.txt', '{d}/gone.txt')",
        "import os; os.link('{d}/keep.txt', 'l'); open('l', 'w').write('changed')",
        "import os; os.symlink('{d}/keep.txt', 's'); open('s', 'w').write('changed')",
        "import sqlite3; sqlite3.connect('{d}/db.sqlite').execute('create table t(x)')",
        "import os; os.mkfifo('{d}/fifo')",
        "import os; os.setxattr('{d}/keep.txt', 'user.x', b'1')",
        "import shutil; shutil.rmtree('{d}')",
        "import os; os.chmod('{d}/keep.txt', 0o777)",
    ],
    "reach the parent": [
        "import os, signal; os.kill({pid}, signal.SIGKILL)",
        "import os, signal; os.kill(-1, signal.SIGKILL); os.kill(os.getppid(), signal.SIGKILL)",
        "import os, signal; fd = os.pidfd_open({pid}); signal.pidfd_send_signal(fd, signal.SIGKILL)",
        "import resource; resource.prlimit({pid}, resource.RLIMIT_NOFILE, (1, 1))",
        "import os; os.setpriority(os.PRIO_PROCESS, {pid}, 19)",
    ],
    "read secrets": [
        "print(open('/proc/{pid}/environ').read())",
        "import os; print(os.environ.get('WANDB_API_KEY'), open('/proc/1/environ').read())",
        "import os; print([open(f'/proc/{{p}}/environ').read() for p in os.listdir('/proc') if p.isdigit()])",
        "print(open('/root/.bash_history').read())",
    ],
    "reach the network": [
        "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')",
        "import socket; print([n for _, n in socket.if_nameindex()]); "
        "socket.create_connection(('localhost', {port}), timeout=2); print('connected')",
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}', timeout=2)",
    ],
    "fill the disk": [
        "open('big', 'w').write('x' * (64 << 20))",
        "for i in range(1000):\n    open(f'f{{i}}', 'w').write('x' * (1 << 20))",
    ],
    "bombs": [
        "import os\nwhile True: os.fork()",
        "import threading, time\nts = [threading.Thread(target=time.sleep, args=(30,)) for _ in range(100000)]\n"
        "[t.start() for t in ts]",
        "x = bytearray(8 * 1024**3)",
        "while True: pass",
        "import sys\nfor _ in range(100): sys.stdout.write('x' * 2**20)",
    ],
    "outlive the kill": [
        "import os, time\nif os.fork() == 0:\n    time.sleep(3); open('{d}/late', 'w')\nos._exit(0)",
        "import threading, time, os\nthreading.Thread(target=lambda: (time.sleep(3), open('{d}/late', 'w'))).start()\n"
        "os._exit(1)",
        "import time; time.sleep(100)",
    ],
}


@pytest.mark.parametrize("category, k", [(c, k) for c, codes in ATTACKS.items() for k in range(len(codes))])
def test_attack_fails_and_changes_nothing(host, category, k):
    d, port = host
    before = snapshot(d)
    code = ATTACKS[category][k].format(d=d, port=port, pid=os.getpid())
    r = run_python(code, timeout=3, cpu_s=2, mem_mb=512, disk_mb=8)
    assert r.reason != "ok" or not any(w in r.stdout for w in ("connected", "pwned")), r
    assert SECRET not in r.stdout + r.stderr
    assert r.seconds < 10
    time.sleep(0.05 if category != "outlive the kill" else 3.5)  # a survivor would write now
    assert snapshot(d) == before, (category, k, r.reason, r.stderr[-500:])
    assert (d / "keep.txt").read_text() == "precious"
    # as a code-task solution, the same attack scores 0, with a reason
    task = {"entry_point": "f", "tests": ["assert candidate(1) == 2"]}
    res = run_tests(code + "\ndef f(x):\n    return x\n", task, timeout=3)
    assert res.reward == 0.0 and res.reason != "all passed"


def test_limits_have_reasons():
    assert run_python("while True: pass", timeout=3, cpu_s=1).reason == "cpu limit"
    assert run_python("import time; time.sleep(9)", timeout=1).reason == "timeout"
    assert run_python("x = bytearray(2 << 30)", mem_mb=256).reason == "memory limit"
    assert run_python("open('f', 'w').write('x' * (20 << 20))", disk_mb=4).reason == "disk full"
    assert run_python("print('x' * 10**6)", max_output=1000).reason == "output limit"
    assert run_python("import os; os.fork()").reason == "exit code 1"  # EPERM: no new processes


def test_what_the_code_sees():
    r = run_python("import os, threading\nt = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
                   "open('a.txt', 'w').write('hi'); print(os.getuid(), open('data.txt').read(), sorted(os.listdir('/')),"
                   " dict(os.environ), len([p for p in os.listdir('/proc') if p.isdigit()]))",
                   files={"data.txt": "given"})
    assert r.ok, r
    assert r.stdout.startswith("thread\n65534 given")
    assert "'home'" not in r.stdout and "'tmp'" not in r.stdout and "'etc'" not in r.stdout and "'work'" not in r.stdout
    assert "WANDB" not in r.stdout and r.stdout.rstrip().endswith("2")  # its own PID namespace: bwrap's init and itself
    assert "a.txt" not in run_python("import os; print(os.listdir('.'))").stdout  # a fresh tmpfs each run


def test_the_trainer_keeps_running_after_everything():
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).returncode == 0


# ---------------------------------------------------------------------------------- unforgeable code rewards

TASK = {"entry_point": "add", "tests": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
                                       "    assert candidate(2, 2) == 4\n    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n"}
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return 0\n"


def test_honest_solutions_score_what_they_pass():
    assert run_tests(RIGHT, TASK).reward == 1.0
    assert run_tests(WRONG, TASK).reward == 0.0


FORGERIES = {
    "print forged pass lines with the harness nonce": (
        "import sys, json\nnonce = sys._getframe(0).f_globals.get('NONCE') or [v for v in globals().values() "
        "if isinstance(v, str) and v.startswith('@@')][0]\n"
        "for i in range(50):\n    print(nonce + json.dumps({'i': i % 3, 'ok': True, 'repr': '3'}))\n" + WRONG),
    "forged line without the ok key": (
        "import sys, json\nn = sys._getframe(0).f_globals['NONCE']\nprint(n + json.dumps({'i': 0}))\n"
        "print(n + json.dumps([1, 2]))\nprint(n + '{broken')\n" + WRONG),
    "an object equal to everything": (
        "class Any:\n    def __eq__(self, o): return True\n    def __sub__(self, o): return 0\n"
        "    def __abs__(self): return 0\n"
        "def add(a, b):\n    return Any()\n"),
    "exit early with success": ("import os\nos._exit(0)\n" + WRONG),
    "out-of-range indices": (
        "import sys, json\nn = sys._getframe(0).f_globals['NONCE']\n"
        "[print(n + json.dumps({'i': i, 'ok': True})) for i in range(-5, 100)]\n" + WRONG),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_results_do_not_pay(name):
    res = run_tests(FORGERIES[name], TASK)
    assert 0.0 <= res.reward <= 1.0 and res.passed <= res.total == 3
    # the two value tests are judged outside the sandbox: no forgery passes them; the abs(...) assert runs
    # next to the solution, where a harness-hunting forgery can fake it (documented in rewards/code.py)
    assert res.passed <= 1, (name, res)


def test_no_working_bwrap_is_a_clear_error_unless_weak_is_chosen(tmp_path):
    code = ("import envs.sandbox as s\ntry:\n    s.run_python('print(1)')\nexcept s.SandboxUnavailable as e:\n"
            "    print('refused:', e)\n")
    env = {**os.environ, "TROUPE_BWRAP": "/bin/false", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "refused: the sandbox cannot start" in r.stdout and "user namespaces" in r.stdout, r.stdout + r.stderr
    weak = subprocess.run([sys.executable, "-c", "import envs.sandbox as s; print(s.run_python('print(6*7)').stdout)"],
                          env={**env, "TROUPE_SANDBOX": "weak"}, capture_output=True, text=True, timeout=60)
    assert weak.stdout.strip() == "42" and "WITHOUT isolation" in weak.stderr  # loudly logged

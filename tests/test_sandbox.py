"""The sandbox attacked for real: every attack must fail, score 0 with a reason, leave this
(trainer) process running and the host unchanged. And code rewards that cannot be forged."""
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from runtime.sandbox import run_python
from rewards.code import run_tests

SECRET = "troupe-secret-4242"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A host directory with files to protect, a live loopback listener, a listening unix socket
    under a tree the sandbox sees read-only (the Python installation, when we may write there), and
    a secret in our env."""
    d = tmp_path_factory.mktemp("host")
    (d / "keep.txt").write_text("precious")
    env = pytest.MonkeyPatch()
    env.setenv("WANDB_API_KEY", SECRET)  # undone after the module: other tests in this worker do not see it
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    u, udir = socket.socket(socket.AF_UNIX), None
    try:
        udir = tempfile.mkdtemp(prefix="troupe-test-", dir=sys.base_prefix)
        os.chmod(udir, 0o755)
        u.bind(os.path.join(udir, "s"))
        os.chmod(os.path.join(udir, "s"), 0o777)
        u.listen()
    except OSError:
        pass  # not writable: the AF_UNIX attacks still run (and must fail) against a path that is not there
    yield d, s.getsockname()[1], os.path.join(udir or "/nonexistent", "s")
    s.close()
    u.close()
    if udir:
        shutil.rmtree(udir, ignore_errors=True)
    env.undo()


def snapshot(d: Path):
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*"))


LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
MOUNT_TMPFS = (LIBC + "uid = os.getuid()\nassert libc.unshare(0x10000000 | 0x20000) == 0, 'unshare'\n"  # NEWUSER|NEWNS
               "open('/proc/self/setgroups', 'w').write('deny')\nopen('/proc/self/uid_map', 'w').write(f'0 {{uid}} 1')\n"
               "open('/proc/self/gid_map', 'w').write(f'0 {{uid}} 1')\n"
               "os.mkdir('m')\nassert libc.mount(b'none', b'm', b'tmpfs', 0, None) == 0, 'mount'\n")
def fill(where):  # 64 MB in 1 MB files, 8x the quota
    return "for i in range(64):\n    open(f'" + where + "/f{{i}}', 'w').write('x' * (1 << 20))\nprint('PWNED')"

# category: [code ...]; {d} = the protected host dir, {port} = a live listener, {pid} = this process.
# An attack that gets through prints PWNED; a refused one raises, is killed, or prints nothing.
ATTACKS = {
    "escape the guard": [
        LIBC + "print(libc.setns(os.open('/proc/1/ns/net', os.O_RDONLY), 0), libc.unshare(0x40000000))\n"
               "open('{d}/x', 'w'); print('PWNED')",
        "import _xxsubinterpreters as s; i = s.create(); s.run_string(i, \"open('{d}/x', 'w')\"); print('PWNED')",
        "import os; assert os.system('echo PWNED > {d}/x') == 0; print('PWNED')",
        "import os; os.execv('/bin/sh', ['sh', '-c', 'echo PWNED > {d}/x'])",
        "import _posixsubprocess, os\n_posixsubprocess.fork_exec(['/bin/sh', '-c', 'echo x > {d}/x'], [b'/bin/sh'], True, (), "
        "None, None, -1, -1, -1, -1, -1, -1, *os.pipe(), False, False, False, None, None, None, -1, None, False)\n"
        "print('PWNED')",
        MOUNT_TMPFS + "print('PWNED')",  # a mount of one's own: the way around the disk quota
        LIBC + "assert libc.syscall(0x40000000 | 57) >= 0\nprint('PWNED')",  # fork through the x32 ABI
        LIBC + "assert libc.syscall(101, 16, 1, 0, 0) == 0\nprint('PWNED')",  # ptrace(ATTACH) bwrap's init
        "print(sorted(__import__('os').listdir('/root')), open('/etc/shadow').read()); print('PWNED')",
    ],
    "write/delete outside": [
        "open('{d}/x', 'w').write('x')",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.open('x', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.unlink('keep.txt', dir_fd=fd)",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.rename('keep.txt', 'g', src_dir_fd=fd, dst_dir_fd=fd)",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.link('keep.txt', 'l', src_dir_fd=fd, dst_dir_fd=fd)",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.symlink('/etc/passwd', 's', dir_fd=fd)",
        "import os; fd = os.open('{d}', os.O_RDONLY); os.mkdir('m', dir_fd=fd)",
        "import os; os.rename('{d}/keep.txt', '{d}/gone.txt')",
        "import os; os.link('{d}/keep.txt', 'l'); open('l', 'w').write('changed')",
        "import os; os.symlink('{d}/keep.txt', 's'); open('s', 'w').write('changed')",
        "import sqlite3; sqlite3.connect('{d}/db.sqlite').execute('create table t(x)')",
        "import os; os.mkfifo('{d}/fifo')",
        "import os; os.setxattr('{d}/keep.txt', 'user.x', b'1')",
        "import shutil; shutil.rmtree('{d}')",
        "import shutil; shutil.copy('/usr/bin/env', '{d}/env')",
        "import os; os.chmod('{d}/keep.txt', 0o777)",
        "import os; os.utime('{d}/keep.txt', (0, 0))",
        "open('/x', 'w').write('x'); print('PWNED')",  # bwrap's root tmpfs
        "open('/dev/shm/x', 'w').write('x'); print('PWNED')",
    ],
    "reach the parent": [
        "import os, signal; os.kill({pid}, signal.SIGKILL)",
        "import os, signal; os.kill(-1, signal.SIGKILL); os.kill(os.getppid(), signal.SIGKILL)",
        "import os, signal; fd = os.pidfd_open({pid}); signal.pidfd_send_signal(fd, signal.SIGKILL)",
        "import resource; resource.prlimit({pid}, resource.RLIMIT_NOFILE, (1, 1))",
        "import os; os.setpriority(os.PRIO_PROCESS, {pid}, 19)",
        "import os; os.setpriority(os.PRIO_USER, 0, 19)",
        "import os; os.killpg(os.getpgid(0), 9)",
    ],
    "read secrets": [
        "print(open('/proc/{pid}/environ').read())",
        "import os; print(os.environ.get('WANDB_API_KEY'), open('/proc/1/environ').read())",
        "import os; print([open(f'/proc/{{p}}/environ').read() for p in os.listdir('/proc') if p.isdigit()])",
        "import os; print(open(f'/proc/{{os.getppid()}}/environ').read(), os.listdir('/proc/{pid}'))",
        "print(open('/root/.bash_history').read())",
        "print(open('{d}/keep.txt').read().replace('precious', 'PWNED'))",  # the host dir is not even visible
    ],
    "reach the network": [
        "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('PWNED')",
        "import socket; print([n for _, n in socket.if_nameindex()]); "
        "socket.create_connection(('localhost', {port}), timeout=2); print('PWNED')",
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}', timeout=2); print('PWNED')",
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('8.8.8.8', 53)); "
        "print('PWNED')",
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/systemd/private'); print('PWNED')",
        # a listening unix socket under a read-only bind (the Python installation): connect() is not a write
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect('{sock}'); s.sendall(b'PWNED'); print('PWNED')",
        "import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); print('PWNED')",
    ],
    "hold memory outside the limit": [  # mem_mb=512: each would hold >= 480 MB that RLIMIT_AS does not count
        "import os\nfds = [os.memfd_create(f'm{{i}}') for i in range(60)]\n"
        "for fd in fds:\n    os.ftruncate(fd, 8 << 20); os.pwrite(fd, b'x' * (8 << 20), 0)\nprint('PWNED')",
        LIBC + "libc.shmat.restype = ctypes.c_void_p\nfor i in range(32):\n    sid = libc.shmget(0, 16 << 20, 0o1600)\n"
               "    assert sid >= 0\n    a = libc.shmat(sid, None, 0)\n"
               "    ctypes.memset(a, 1, 16 << 20); libc.shmdt(ctypes.c_void_p(a))\nprint('PWNED')",
        LIBC + "q = libc.msgget(0, 0o1600)\nassert q >= 0\nprint('PWNED')",
        LIBC + "q = libc.mq_open(b'/q', 0o100 | 0o2, 0o600, None)\nassert q >= 0\nprint('PWNED')",
    ],
    "fill the disk": [
        "open('big', 'w').write('x' * (64 << 20)); print('PWNED')",
        fill("."),
        fill("/dev/shm"),
        MOUNT_TMPFS + fill("m"),
    ],
    "bombs": [
        "import os\nwhile True: os.fork()",
        "import threading, time\nts = [threading.Thread(target=time.sleep, args=(30,)) for _ in range(100000)]\n"
        "[t.start() for t in ts]\nprint('PWNED')",
        "x = bytearray(8 * 1024**3); print('PWNED')",
        "while True: pass",
        "import sys\nfor _ in range(100): sys.stdout.write('x' * 2**20)",
        "import os\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in range(100000)]; print('PWNED')",
    ],
    "outlive the kill": [  # each survivor would rename itself {marker} and write {d}/late after 1 s
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1); open('{d}/late', 'w')\nos._exit(0)",
        LIBC + "import threading, time\ndef live():\n    libc.prctl(15, b'{marker}'); time.sleep(1); open('{d}/late', 'w')\n"
               "threading.Thread(target=live).start(); time.sleep(0.2); os._exit(1)",
        LIBC + "import time; libc.prctl(15, b'{marker}'); time.sleep(100)",
    ],
}


def host_comms():
    """The name of every thread on the host (an escaped thread would carry its marker here)."""
    names = set()
    for comm in Path("/proc").glob("[0-9]*/task/*/comm"):
        try:
            names.add(comm.read_text().strip())
        except OSError:
            pass
    return names


@pytest.mark.parametrize("category, k", [(c, k) for c, codes in ATTACKS.items() for k in range(len(codes))])
def test_attack_fails_and_changes_nothing(host, category, k):
    d, port, sock = host
    before, limits, prio = snapshot(d), resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0)
    marker = f"trp{os.getpid() % 10000}{k}"
    code = ATTACKS[category][k].format(d=d, port=port, pid=os.getpid(), marker=marker, sock=sock)
    r = run_python(code, timeout=2, cpu_s=1, mem_mb=512, disk_mb=8)
    assert "PWNED" not in r.stdout, (category, k, r)
    assert SECRET not in r.stdout + r.stderr
    assert r.seconds < 10
    if category == "outlive the kill":
        assert marker not in host_comms()  # nothing of it runs any more ...
        time.sleep(1.5)  # ... and nothing writes late
    assert snapshot(d) == before, (category, k, r.reason, r.stderr[-500:])
    assert (d / "keep.txt").read_text() == "precious"
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limits and os.getpriority(os.PRIO_PROCESS, 0) == prio
    # as a code-task solution, the same attack scores 0, with a reason
    task = {"entry_point": "f", "tests": ["assert candidate(1) == 2"]}
    res = run_tests(code + "\ndef f(x):\n    return x\n", task, timeout=2)
    assert res.reward == 0.0 and res.reason and res.reason != "all passed", res


def test_limits_have_reasons():
    assert run_python("while True: pass", timeout=60, cpu_s=1).reason == "cpu limit"  # 1 CPU s, however loaded
    assert run_python("import time; time.sleep(9)", timeout=1).reason == "timeout"
    assert run_python("x = bytearray(2 << 30)", mem_mb=256).reason == "memory limit"
    assert run_python("open('f', 'w').write('x' * (20 << 20))", disk_mb=4).reason == "disk full"
    assert run_python("print('x' * 10**6)", max_output=1000).reason == "output limit"
    assert run_python("import os; os.fork()").reason == "exit code 1"  # EPERM: no new processes


def test_what_the_code_sees(host):  # host: a secret in our environment, which the code must not see
    r = run_python("import os, threading\nt = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
                   "open('a.txt', 'w').write('hi'); print(os.getuid(), open('data.txt').read(), sorted(os.listdir('/')),"
                   " dict(os.environ), len([p for p in os.listdir('/proc') if p.isdigit()]))",
                   files={"data.txt": "given"})
    assert r.ok, r
    assert r.stdout.startswith("thread\n65534 given")
    assert "'home'" not in r.stdout and "'tmp'" not in r.stdout and "'etc'" not in r.stdout and "'work'" not in r.stdout
    assert "WANDB" not in r.stdout and r.stdout.rstrip().endswith("2")  # its own PID namespace: bwrap's init and itself
    assert "a.txt" not in run_python("import os; print(os.listdir('.'))").stdout  # a fresh tmpfs each run


def test_what_still_works_without_unix_sockets_and_memfd():
    """asyncio (a socketpair), ctypes callbacks (libffi falls back from memfd) and sqlite still run."""
    r = run_python("import asyncio, ctypes, socket, sqlite3\nasync def f():\n    return 40\n"
                   "cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)\na, b = socket.socketpair()\n"
                   "a.send(b'!')\nprint(cb(asyncio.run(f())), b.recv(1).decode(), "
                   "sqlite3.connect(':memory:').execute('select 1').fetchone()[0])")
    assert r.ok and r.stdout == "41 ! 1\n", r


def test_the_trainer_keeps_running_after_everything():
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).returncode == 0


# ---------------------------------------------------------------------------------- unforgeable code rewards

# Every test runs in a judge sandbox that runs none of the solution's code; the solution's function is
# called through a pipe and only plain data comes back (rewards/code.py). A forgery scores what an
# honest function returning the same values would, never more.
TASK = {"entry_point": "add", "tests": "def check(candidate):\n    assert True, 'not a test'\n"
                                       "    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
                                       "    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n"}
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return 0\n"
HUNT = ("import json, os, sys\n"
        "def nonce():  # the harness's nonce, from its globals\n"
        "    for f in (sys._getframe(k) for k in range(3)):\n"
        "        for v in f.f_globals.values():\n"
        "            if isinstance(v, str) and v.startswith('@@'):\n                return v\n"
        "    return [v for v in globals().values() if isinstance(v, str) and v.startswith('@@')][0]\n"
        "def forge(d):\n    line = (nonce() + json.dumps(d) + '\\n').encode()\n"
        "    os.write(1, line); sys.__stdout__.write(line.decode()); sys.__stdout__.flush(); print(line.decode())\n")
FORGERIES = {
    "forged pass lines with the harness nonce": HUNT + (
        "def add(a, b):\n    for i in range(50):\n        forge({'i': i % 5, 'ok': True, 'values': ['3']})\n    return 0\n"),
    "forged lines without ok, broken JSON, junk": HUNT + (
        "def add(a, b):\n    for d in ({'i': 1}, [1, 2], {'i': '1', 'ok': 1}, {'i': 1.0, 'ok': True}, {'values': 3}):\n"
        "        forge(d)\n    os.write(1, (nonce() + '{broken\\n').encode())\n    return 0\n"),
    "out-of-range and repeated indices": HUNT + (
        "def add(a, b):\n    [forge({'i': i, 'ok': True}) for i in range(-5, 100)]\n    return 0\n"),
    "an object equal to everything": (
        "class Any:\n    def __eq__(self, o): return True\n    def __sub__(self, o): return 0\n"
        "    def __abs__(self): return 0\n    def __lt__(self, o): return True\n    def __repr__(self): return '3'\n"
        "def add(a, b):\n    return Any()\n"),
    "an int subclass equal to everything": (
        "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return I(0)\n"),
    "exit early with success": "import os\nos._exit(0)\n" + WRONG,
    "exit with success from the first call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "forged lines on stderr": HUNT + (
        "def add(a, b):\n    os.write(2, (nonce() + json.dumps({'i': 1, 'values': ['3']}) + '\\n').encode())\n    return 0\n"),
    "patch the harness's emit": (
        "import sys\ndef add(a, b):\n    g = sys._getframe(1).f_globals\n    real = g['emit']\n"
        "    g['emit'] = lambda d: real({**d, 'ok': True, 'values': ['3'] * len(d.get('values', [0]))})\n"
        "    g['plain'] = lambda v: v\n    return 0\n"),
    "the harness found through gc and every frame": (
        "import gc, json, os, sys\ndef add(a, b):\n    for o in gc.get_objects():\n"
        "        if callable(o) and getattr(o, '__name__', '') in ('emit', 'report'):\n"
        "            for i in range(5):\n                try:\n                    o({'i': i, 'ok': True, 'values': ['3']})\n"
        "                except Exception:\n                    pass\n"
        "    for f in sys._current_frames().values():\n        while f is not None:\n"
        "            for v in list(f.f_globals.values()) + list(f.f_locals.values()):\n"
        "                if isinstance(v, str) and v.startswith('@@'):\n"
        "                    for i in range(5):\n"
        "                        os.write(1, (v + json.dumps({'i': i, 'ok': True}) + '\\n').encode())\n"
        "            f = f.f_back\n    return 0\n"),
}


def test_honest_solutions_score_what_they_pass():
    assert run_tests(RIGHT, TASK).reward == 1.0  # 3 tests: `assert True` is not one
    assert run_tests(WRONG, TASK).reward == 0.0 and run_tests(WRONG, TASK).total == 3
    assert run_tests("def add(a, b):\n    return 3\n", TASK).passed == 1
    assert run_tests("def add(a, b):\n    return a + b + 1e-12\n", TASK).passed == 1  # the judge: |x - .75| < 1e-9
    mbpp = {"entry_point": "add", "tests": ["assert add(1, 2) == 3", "assert abs(add(1, 1) - 2) < 0.1"]}
    assert run_tests(RIGHT, mbpp).reward == 1.0 and run_tests(WRONG, mbpp).reward == 0.0


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_results_do_not_pay(name):
    res = run_tests(FORGERIES[name], TASK)
    assert res.total == 3 and res.passed == 0, (name, res)


def test_forgeries_cannot_break_the_code_team_env():
    from envs.code_team import CodeTeamEnv
    env = CodeTeamEnv(max_refinement_iterations=1)
    env.reset({"prompt": "def add(a, b):\n", **TASK})
    for name in ("forged lines without ok, broken JSON, junk", "exit early with success"):
        env.step("```python\n" + FORGERIES[name] + "```")
    assert env.turn_rewards() == [0.0, 0.0] and env.metrics()["final_success"] == 0.0


# An assert that reads a setup variable once ran next to the solution, where a solution
# that patched its harness passed it; now every assert runs in the judge.
IN_PROCESS = {"entry_point": "add", "tests": "def check(candidate):\n    x = 1\n    assert candidate(x, 2) == 3\n"}


def test_asserts_on_setup_variables_refuse_fake_objects_and_harness_hunters():
    assert run_tests(RIGHT, IN_PROCESS).reward == 1.0 and run_tests(WRONG, IN_PROCESS).reward == 0.0
    res = run_tests(FORGERIES["an object equal to everything"], IN_PROCESS)
    assert res.reward == 0.0 and "not plain data" in res.failures[0], res
    res = run_tests(FORGERIES["an int subclass equal to everything"], IN_PROCESS)  # comes back as its data: 0
    assert res.reward == 0.0 and "returned 0)" in res.failures[0], res
    for name in ("patch the harness's emit", "the harness found through gc and every frame"):
        assert run_tests(FORGERIES[name], IN_PROCESS).reward == 0.0, name


def test_humaneval_wrong_solutions_score_nothing():
    from data.code_data import load_humaneval
    from rewards.code import _plan, split_tests
    tasks = load_humaneval()
    assert sum(len(_plan(split_tests(t["tests"]), t["entry_point"])[1]) for t in tasks) > 1100
    with_assert_true = [t for t in tasks if "assert True" in t["tests"]][:3]
    for t in with_assert_true:  # `assert True, '...'` lines no longer pay a wrong solution
        assert run_tests(f"def {t['entry_point']}(*a, **k):\n    return None\n", t).reward == 0.0


def test_run_tests_never_raises_on_bad_tasks():
    for task in ({"tests": ["assert candidate(1) == 1"]}, {"entry_point": "f", "tests": "def check(c:\n"},
                 {"entry_point": "f", "tests": 3}, {"entry_point": "f", "tests": ["assert f(" + "(" * 10**5]}):
        res = run_tests(RIGHT, task)
        assert res.reward == 0.0 and res.reason


def test_no_working_bwrap_is_a_clear_error_unless_weak_is_chosen(tmp_path):
    code = ("import runtime.sandbox as s\ntry:\n    s.run_python('print(1)')\nexcept s.SandboxUnavailable as e:\n"
            "    print('refused:', e)\n")
    env = {**os.environ, "TROUPE_BWRAP": "/bin/false", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "refused: the sandbox cannot start" in r.stdout and "user namespaces" in r.stdout, r.stdout + r.stderr
    weak = subprocess.run([sys.executable, "-c", "import runtime.sandbox as s; print(s.run_python('print(6*7)').stdout)"],
                          env={**env, "TROUPE_SANDBOX": "weak"}, capture_output=True, text=True, timeout=60)
    assert weak.stdout.strip() == "42" and "WITHOUT isolation" in weak.stderr  # loudly logged


# A test that calls a method on the result (`candidate('ab').upper() == 'AB'`) used to reach the
# worker's object through its handle: a wrong solution returning an object whose methods lie passed.
# A handle for a value the code under test returned is now opaque to the judge (no
# attribute reads, no calls), and a subclass of a plain builtin comes back as its builtin data.
METHOD_TESTS = {"entry_point": "f", "tests": [
    "assert f('ab').upper() == 'AB'", "assert f('abca').count('a') == 2",
    "assert sorted(f({'a': 1}).items()) == [('a', 1)]", "assert list(f({'a': 1}).keys()) == ['a']",
    "assert f([1, 2, 3]).__len__() == 3", "assert f('abc').startswith('ab')", "assert f('a b').split() == ['a', 'b']",
    "assert f(' x ').strip() == 'x'", "assert f({'k': 5}).get('k') == 5", "assert f(3 + 4j).real == 3.0",
    "assert f(['ab'])[0].upper() == 'AB'", "assert 'AB' in str(f('xABy'))"]}
LIAR = ("class AB:  # the name its handle's text showed\n    real = 3.0\n"
        "    def upper(self): return 'AB'\n    def count(self, x): return 2\n"
        "    def items(self): return [('a', 1)]\n    def keys(self): return ['a']\n    def __len__(self): return 3\n"
        "    def startswith(self, x): return True\n    def split(self): return ['a', 'b']\n"
        "    def strip(self): return 'x'\n    def get(self, k): return 5\n    def __getitem__(self, i): return self\n")
LIARS = {
    "an object whose methods lie": LIAR + "def f(x):\n    return AB()\n",
    "a list holding one": LIAR + "def f(x):\n    return [AB()]\n",
    "builtin subclasses whose methods lie": (
        "class S(str):\n    def upper(self): return 'AB'\n    def count(self, x): return 2\n"
        "    def startswith(self, x): return True\n    def split(self): return ['a', 'b']\n"
        "    def strip(self): return 'x'\n    def __eq__(self, o): return True\n    __hash__ = str.__hash__\n"
        "class D(dict):\n    def items(self): return [('a', 1)]\n    def keys(self): return ['a']\n"
        "    def get(self, k): return 5\n    def __iter__(self): return iter(['a'])\n"
        "class L(list):\n    def __len__(self): return 3\n    def __getitem__(self, i): return S('zz')\n"
        "class C(complex):\n    real = 3.0\n"
        "def f(x):\n    return {str: S('zz'), dict: D(z=0), list: L(), complex: C(0)}[type(x)]\n"),
}


@pytest.mark.parametrize("name", list(LIARS))
def test_methods_of_a_returned_object_cannot_forge_a_pass(name):
    res = run_tests(LIARS[name], METHOD_TESTS)
    assert res.total == 12 and res.passed == 0, (name, res.passed, res.failures)


def test_results_that_use_those_methods_honestly_still_pass():
    assert run_tests("def f(x):\n    return x\n", METHOD_TESTS).reward == 1.0
    # subclasses of plain builtins (Counter, OrderedDict, a str subclass, a namedtuple) come back as their data
    honest = ("import collections\nclass S(str):\n    pass\nP = collections.namedtuple('P', 'a b')\n"
              "def f(x):\n    if type(x) is dict:\n        return collections.OrderedDict(x)\n"
              "    if type(x) is list:\n        return collections.UserList(x).data\n"
              "    return S(x) if type(x) is str else x\n"
              "def g(s):\n    return collections.Counter(s)\n"
              "def h():\n    return P(1, 2)\n")
    assert run_tests(honest, METHOD_TESTS).reward == 1.0
    assert run_tests(honest, {"entry_point": "g", "tests": ["assert g('abb') == {'a': 1, 'b': 2}"]}).reward == 1.0
    namedtuple = {"entry_point": "h", "tests": ["assert h() == (1, 2)", "assert h()[1] == 2"]}
    assert run_tests(honest, namedtuple).reward == 1.0

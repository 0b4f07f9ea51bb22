"""Run untrusted, model-written Python in a separate, limited process: `run_python(code) -> SandboxResult`.

What is enforced (Linux):
  - wall-clock timeout: the whole process group is SIGKILLed at the deadline;
  - RLIMIT_CPU (CPU seconds), RLIMIT_AS (memory), RLIMIT_FSIZE (bytes per written file),
    RLIMIT_NOFILE, RLIMIT_CORE = 0, RLIMIT_NPROC (processes);
  - a fresh temp working directory, deleted afterwards; a clean environment (PATH, HOME=cwd,
    LANG); `python -I -B` (no user site, no env vars, no .pyc);
  - output read with a byte cap (`max_output`); past it the group is killed ("output limit");
  - when run as root: an empty network namespace (unshare CLONE_NEWNET: no interface, not even
    loopback), and, where uid `nobody` can execute this interpreter (not a venv under /root), a
    switch to uid/gid `nobody`, so the code can neither signal the trainer nor write to its files;
    RLIMIT_NPROC then applies to that uid (root ignores RLIMIT_NPROC);
  - inside the child, before the code runs, a Python audit hook (PEP 578) that refuses: opening a
    file for writing outside the working directory, creating sockets, fork/exec/spawn/system,
    os.kill/killpg, and loading native code through ctypes. This layer also holds for non-root
    users, where namespaces and setuid are unavailable. An audit hook is defence in depth for
    model-written code, not a jail for a determined attacker with a native exploit.
Every failure comes back as a SandboxResult with a reason; nothing raises into the trainer.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)  # loaded in the parent: no dlopen after fork
IS_ROOT = os.geteuid() == 0
try:
    import pwd
    _NOBODY = pwd.getpwnam("nobody")
    NOBODY_UID, NOBODY_GID = _NOBODY.pw_uid, _NOBODY.pw_gid
except (ImportError, KeyError):
    NOBODY_UID = NOBODY_GID = None


def _others_can_run(path: str) -> bool:
    """Can an unprivileged uid execute `path` (every parent dir o+x, the file o+x)?"""
    import stat
    p = os.path.realpath(path)
    parts = p.split(os.sep)
    for i in range(2, len(parts) + 1):
        d = os.sep.join(parts[:i]) or os.sep
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


# Drop to `nobody` only where that uid can run this interpreter (a venv under /root cannot be);
# otherwise the namespace, rlimits and audit hook still apply.
SETUID = IS_ROOT and NOBODY_UID is not None and _others_can_run(sys.executable)

# The child runs this before the model's code: it installs the audit hook, then executes main.py.
PRELUDE = r'''
import os, sys
_CWD = os.path.realpath(os.getcwd())
_SRC = open("main.py").read()
_BLOCK = {"socket.__new__": "no network", "socket.connect": "no network", "socket.bind": "no network",
          "os.fork": "no new processes", "os.forkpty": "no new processes", "os.posix_spawn": "no new processes",
          "os.exec": "no new processes", "os.spawn": "no new processes", "subprocess.Popen": "no new processes",
          "os.system": "no new processes", "pty.spawn": "no new processes", "os.kill": "no signals",
          "os.killpg": "no signals", "signal.pthread_kill": "no signals", "ctypes.dlopen": "no native code",
          "ctypes.dlsym": "no native code", "ctypes.cdata": "no native code"}
def _hook(event, args):
    if event in _BLOCK:
        raise PermissionError("sandbox: " + _BLOCK[event] + " (" + event + ")")
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
        if writing and isinstance(path, (str, bytes, os.PathLike)):
            p = os.path.realpath(os.fsdecode(path))
            if p != _CWD and not p.startswith(_CWD + os.sep):
                raise PermissionError("sandbox: writing outside the working directory: " + p)
    elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.symlink", "os.link",
                   "shutil.rmtree", "os.truncate", "os.chown", "os.utime"):
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)):
                p = os.path.realpath(os.fsdecode(a))
                if p != _CWD and not p.startswith(_CWD + os.sep):
                    raise PermissionError("sandbox: changing files outside the working directory: " + p)
sys.addaudithook(_hook)
del _hook
__name__ = "__main__"
exec(compile(_SRC, "main.py", "exec"))
'''


@dataclass
class SandboxResult:
    ok: bool  # exited 0 within every limit
    returncode: int | None
    stdout: str
    stderr: str
    reason: str  # "ok", "timeout", "cpu limit", "memory limit", "output limit", "exit code N", "signal N", ...
    seconds: float


def _limits(cpu_s, mem_bytes, fsize, nproc, net):
    def apply():
        if net == "none":
            # an empty network namespace; needs CAP_SYS_ADMIN (root). Failure is tolerated: the
            # audit hook still refuses sockets.
            _libc.unshare(CLONE_NEWNET)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if SETUID:
            os.setgroups([])
            os.setgid(NOBODY_GID)
            os.setuid(NOBODY_UID)
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    return apply


def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.kill()
    except ProcessLookupError:
        pass


def run_python(code: str, timeout: float = 5.0, cpu_s: int = 5, mem_mb: int = 1024, max_output: int = 64_000,
               max_file_mb: int = 16, nproc: int = 16, net: str = "none", files: dict[str, str] | None = None,
               stdin: str = "") -> SandboxResult:
    """Execute `code` as main.py in a fresh temp dir under the limits above. Never raises."""
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix="troupe-sbx-")
    try:
        with open(os.path.join(work, "main.py"), "w") as f:
            f.write(code)
        for name, text in (files or {}).items():
            if os.sep in name or name.startswith("."):
                return SandboxResult(False, None, "", "", f"bad file name {name!r}", 0.0)
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        if SETUID:
            for n in os.listdir(work) + ["."]:
                os.chown(os.path.join(work, n), NOBODY_UID, NOBODY_GID)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        try:
            p = subprocess.Popen([sys.executable, "-I", "-B", "-c", PRELUDE], cwd=work, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, close_fds=True,
                                 preexec_fn=_limits(cpu_s, mem_mb * 2**20, max_file_mb * 2**20, nproc, net))
        except OSError as e:
            return SandboxResult(False, None, "", "", f"could not start: {e}", time.perf_counter() - t0)
        try:
            if stdin:
                p.stdin.write(stdin.encode()[:max_output])
            p.stdin.close()
        except OSError:
            pass
        out, err = bytearray(), bytearray()
        streams = {p.stdout.fileno(): out, p.stderr.fileno(): err}
        deadline = t0 + timeout
        reason = None
        while streams:
            left = deadline - time.perf_counter()
            if left <= 0:
                reason = "timeout"
                break
            ready, _, _ = select.select(list(streams), [], [], min(left, 0.5))
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    del streams[fd]
                    continue
                streams[fd].extend(chunk)
                if len(out) + len(err) > max_output:
                    reason = "output limit"
                    break
            if reason:
                break
        if reason:
            _kill_group(p)
        try:
            rc = p.wait(timeout=max(0.1, deadline - time.perf_counter()) if not reason else 5)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            rc = p.wait()
            reason = reason or "timeout"
        _kill_group(p)  # anything it left behind in its group
        for s in (p.stdout, p.stderr):
            s.close()
        o = out[:max_output].decode("utf-8", "replace")
        e = err[:max_output].decode("utf-8", "replace")
        blocked = [ln for ln in e.splitlines() if ln.startswith("PermissionError: sandbox: ")]
        if reason is None and blocked:
            reason = "blocked: " + blocked[-1].split("sandbox: ", 1)[1]
        if reason is None:
            if rc == 0:
                reason = "ok"
            elif rc == -signal.SIGXCPU or rc == -signal.SIGKILL and "MemoryError" not in e and time.perf_counter() - t0 < timeout:
                reason = "cpu limit" if rc == -signal.SIGXCPU else f"signal {-rc}"
            elif "MemoryError" in e:
                reason = "memory limit"
            elif rc < 0:
                reason = f"signal {-rc}"
            else:
                reason = f"exit code {rc}"
        return SandboxResult(reason == "ok", rc, o, e, reason, time.perf_counter() - t0)
    except Exception as ex:  # noqa: BLE001 — the trainer must keep running whatever the code did
        return SandboxResult(False, None, "", "", f"sandbox error: {type(ex).__name__}: {ex}", time.perf_counter() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)

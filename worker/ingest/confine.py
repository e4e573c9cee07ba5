"""Confinement of the processes that parse untrusted PDFs (`worker.ingest.reader_child`).

The parent starts a reader with `child_env()`: a minimal environment that holds no key,
password or URL of the service (an allow-list of paths and locale variables, never a copy of
`os.environ`). The reader then calls `confine()` on itself, once its modules are imported and
before it reads the PDF:

- resource limits: address space (RLIMIT_AS), size of any file it writes (RLIMIT_FSIZE: its
  log, the only file it holds open for writing), no core files; CPU time is limited per
  request with `cpu_limit()` (RLIMIT_CPU: SIGXCPU ends the process);
- network (Linux, where the kernel allows it): a new, empty network namespace (`unshare`,
  in a new user namespace when not root), and Landlock's TCP rules (kernel ABI 4+) deny
  any TCP bind or connect;
- filesystem (Linux 5.13+, Landlock): read and execute only under the Python installation,
  the `worker` package, the system directories `/usr`, `/lib*`, and the Tesseract language
  data; no write, create or delete anywhere. So the service's home (every tenant's uploads,
  the SQLite store, the index), `/etc`, and `/proc` (other processes' environments) cannot
  be opened. The PDF itself arrives over a pipe; no path to it is given;
- other processes (Landlock ABI 6+, Linux 6.12+): scoped, so no signal reaches a process
  outside the reader's own Landlock domain and no abstract Unix socket outside it can be
  reached (Landlock also refuses `ptrace` of any process outside the domain, from ABI 1);
- system calls (`worker.ingest.syscall_filter`, seccomp, x86-64 and AArch64): no socket can
  be made or connected (Unix sockets by path included), signals only to itself, no
  `ptrace`, `process_vm_*` or `io_uring`.

Not restricted: reading world-readable files under the allowed system directories, writing
to the descriptors it was given (its pipes and its log), and whatever a layer above could
not be applied (an old kernel, a container that refuses user namespaces or seccomp):
`confine()` reports what it applied, and the parent logs a warning naming what is missing
(`worker.ingest.sandbox`).
"""

from __future__ import annotations

import ctypes
import os
import resource
import site
import sys
from pathlib import Path

from worker.ingest.syscall_filter import install as install_syscall_filter

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# Variables a reader needs to find Python, its libraries and Tesseract's data: paths and
# locale only. Anything else (CONDUIT_*, REDIS_*, tokens, proxies) never reaches a reader.
_PASSED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONHOME", "LD_LIBRARY_PATH",
           "TESSDATA_PREFIX")
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/opt/conda")

# Linux: unshare(2) flags, prctl(2) option, Landlock syscalls and access rights
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_O_PATH = getattr(os, "O_PATH", 0)


def child_env(tessdata: str | None = None) -> dict[str, str]:
    """The whole environment of a reader process: the allow-listed variables of this
    process, one thread for OpenMP, a small malloc arena count, and `PYTHONPATH` to the
    package root. `tessdata` (Tesseract's language data) is passed as `TESSDATA_PREFIX`."""
    env = {name: os.environ[name] for name in _PASSED if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env.update({"HOME": "/nonexistent", "OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "1",
                "MALLOC_ARENA_MAX": "2", "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)})
    if tessdata:
        env["TESSDATA_PREFIX"] = tessdata
    return env


def confine(*, memory_bytes: int, file_bytes: int, readable: list[str] | None = None) -> str:
    """Limit this process for good (see the module docstring) and return what was applied,
    e.g. "rlimits,netns,landlock-fs,landlock-tcp,landlock-scope,seccomp". `readable`: more
    folders it may read."""
    applied = ["rlimits"]
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if file_bytes > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not sys.platform.startswith("linux"):
        return ",".join(applied)
    libc = ctypes.CDLL(None, use_errno=True)
    if _unshare_network(libc):
        applied.append("netns")
    applied.extend(_landlock(libc, _readable_roots() + list(readable or [])))
    if install_syscall_filter(libc):  # last: it refuses the sockets nothing above needs
        applied.append("seccomp")
    return ",".join(applied)


def cpu_limit(seconds: float) -> None:
    """Allow this process `seconds` more CPU time from now (the soft RLIMIT_CPU; past it
    the kernel sends SIGXCPU, which ends the process)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(spent + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _unshare_network(libc: ctypes.CDLL) -> bool:
    """Move into a new network namespace (only a down loopback in it): directly when
    privileged, else inside a new user namespace (refused in many containers)."""
    if os.geteuid() == 0 and libc.unshare(_CLONE_NEWNET) == 0:
        return True
    return bool(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0)


def _readable_roots() -> list[str]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(),
             str(Path(sys.executable).resolve().parent.parent),
             str(_PACKAGE_ROOT / "worker"), *_SYSTEM_DIRS}
    if os.environ.get("TESSDATA_PREFIX"):
        roots.add(os.environ["TESSDATA_PREFIX"])
    return sorted(roots)


def _landlock(libc: ctypes.CDLL, readable: list[str]) -> list[str]:
    """Allow reading only under `readable`, deny TCP (ABI 4+), scope signals and abstract
    Unix sockets to the domain (ABI 6+); [] when unsupported."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return []
    fs = (1 << 13) - 1  # ABI 1: execute ... make_sym
    for version, right in ((2, 1 << 13), (3, 1 << 14), (5, 1 << 15)):  # refer, truncate, ioctl
        if abi >= version:
            fs |= right
    net = 0b11 if abi >= 4 else 0  # bind and connect TCP
    scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)  # struct landlock_ruleset_attr
    size = 24 if scoped else 16 if net else 8  # the fields this kernel knows
    ruleset = syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0))
    if ruleset < 0:
        return []
    try:
        for path in readable:
            _allow(syscall, int(ruleset), path)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
                syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return []
    finally:
        os.close(ruleset)
    return ["landlock-fs"] + (["landlock-tcp"] if net else []) + \
        (["landlock-scope"] if scoped else [])


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _allow(syscall: ctypes._NamedFuncPointer, ruleset: int, path: str) -> None:
    try:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
    except OSError:  # not on this machine
        return
    try:
        rights = _FS_READ_FILE | _FS_EXECUTE
        if os.path.isdir(path):
            rights |= _FS_READ_DIR
        rule = _PathBeneath(rights, fd)
        syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(rule), ctypes.c_uint32(0))
    finally:
        os.close(fd)

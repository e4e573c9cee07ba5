"""A seccomp filter that keeps a reader process away from every other process.

Installed by `confine.confine()` as the reader's last step (Linux on x86-64 or AArch64). From
then on, in that process and anything it could start:

- no socket can be made or connected (`socket`, `socketpair`, `connect`): a reader talks to
  its parent over the pipes it was given, so a Unix socket reachable by path (a database's,
  a container runtime's) stays out of reach even where Landlock cannot scope it;
- a signal reaches this process only: `kill`, `tgkill`, `rt_sigqueueinfo` and
  `rt_tgsigqueueinfo` must name its own process id (so `kill(0, ...)`, its process group,
  and `kill(-1, ...)` are refused too); `tkill` and `pidfd_send_signal` are refused;
- no other process's memory or descriptors: `ptrace`, `process_vm_readv`,
  `process_vm_writev`, `pidfd_getfd` are refused, and `io_uring_setup` too (its requests
  would not pass through this filter).

A refused call fails with EPERM. A system call of another ABI than the process's own (i386
calls from an x86-64 process, x32 calls) ends the process, so the filter cannot be bypassed
by switching ABI. On any other architecture `install()` applies nothing and says so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
_RET_EPERM = 0x00050000 | errno.EPERM
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian args)
_X32_BIT = 0x40000000

# audit architecture and the numbers of the calls above on each supported machine
_ABIS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "socket": 41, "connect": 42, "socketpair": 53, "kill": 62, "ptrace": 101,
        "rt_sigqueueinfo": 129, "tkill": 200, "tgkill": 234, "rt_tgsigqueueinfo": 297,
        "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_send_signal": 424,
        "io_uring_setup": 425, "pidfd_getfd": 438}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "connect": 203, "socketpair": 199, "kill": 129, "ptrace": 117,
        "rt_sigqueueinfo": 138, "tkill": 130, "tgkill": 131, "rt_tgsigqueueinfo": 240,
        "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_send_signal": 424,
        "io_uring_setup": 425, "pidfd_getfd": 438}),
}
_OWN_PID_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
_REFUSED = ("socket", "socketpair", "connect", "tkill", "pidfd_send_signal", "ptrace",
            "process_vm_readv", "process_vm_writev", "pidfd_getfd", "io_uring_setup")

# one BPF instruction before its jumps are resolved: (code, jump-if-true label,
# jump-if-false label, operand); a label of None means the next instruction
_Op = tuple[int, str | None, str | None, int]


def program(machine: str, pid: int) -> bytes | None:
    """The filter for a process `pid` on `machine` (`platform.machine()`), as the bytes of
    its `struct sock_filter` array; None for an unsupported machine."""
    if machine not in _ABIS:
        return None
    arch, numbers = _ABIS[machine]
    ops: list[tuple[str | None, _Op]] = [
        (None, (_LD_W_ABS, None, None, _ARCH)),
        (None, (_JEQ_K, None, "kill_process", arch)),
        (None, (_LD_W_ABS, None, None, _NR)),
    ]
    if machine == "x86_64":
        ops.append((None, (_JGE_K, "kill_process", None, _X32_BIT)))
    ops += [(None, (_JEQ_K, "refuse", None, numbers[name])) for name in _REFUSED]
    ops += [(None, (_JEQ_K, "own_pid", None, numbers[name])) for name in _OWN_PID_ONLY]
    ops += [
        (None, (_RET_K, None, None, _RET_ALLOW)),
        ("own_pid", (_LD_W_ABS, None, None, _ARG0_LOW)),  # the kernel reads it as an int
        (None, (_JEQ_K, "allow", "refuse", pid)),
        ("allow", (_RET_K, None, None, _RET_ALLOW)),
        ("refuse", (_RET_K, None, None, _RET_EPERM)),
        ("kill_process", (_RET_K, None, None, _RET_KILL_PROCESS)),
    ]
    at = {label: i for i, (label, _) in enumerate(ops) if label}
    out = bytearray()
    for i, (_, (code, jt, jf, k)) in enumerate(ops):
        out += struct.pack("<HBBI", code, at[jt] - i - 1 if jt else 0,
                           at[jf] - i - 1 if jf else 0, k & 0xFFFFFFFF)
    return bytes(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(libc: ctypes.CDLL) -> bool:
    """Install the filter on this process for good (see the module docstring); False when
    the machine is not supported or the kernel refused it."""
    code = program(platform.machine(), os.getpid())
    if code is None:
        return False
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return bool(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0)

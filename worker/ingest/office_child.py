"""The LibreOffice process: `main([MEMORY_BYTES, FILE_BYTES, SECONDS, SOFFICE, FILTER, INPUT])`,
run as `python -c` in its own session (process group) with a minimal environment and, as
its working directory, a private folder holding INPUT (`worker.ingest.office`).

It limits itself, then replaces itself with LibreOffice headless converting INPUT to
`out/<name>.pdf` with the export FILTER:
- resource limits for it and every process it starts: address space, size of any file
  written, CPU time in all (SECONDS), no core files;
- namespaces (as root, or inside a new user namespace mapping only the caller's ids, where
  the kernel allows one): an empty network namespace, and a mount namespace with a private,
  size-capped `/tmp`, so the sockets and files LibreOffice keeps under `/tmp` vanish with it;
- a profile made for this run only, whose settings disable macros outright (they never run,
  whatever the document holds) and block links to untrusted places.

Landlock and the seccomp filter of the PDF readers are not applied: LibreOffice's launcher
talks to its office process over a Unix socket and reads configuration across `/etc`.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from pathlib import Path

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 1 << 12, 1 << 14, 1 << 18
_WORK = "/tmp/conduit-work"
_TMP_SIZE = "size=256m,mode=1777"

_PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry"
 xmlns:xs="http://www.w3.org/2001/XMLSchema"
 xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Security/Scripting"><prop
 oor:name="DisableMacrosExecution" oor:op="fuse"><value>true</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Security/Scripting"><prop
 oor:name="MacroSecurityLevel" oor:op="fuse"><value>3</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Security"><prop
 oor:name="BlockUntrustedRefererLinks" oor:op="fuse"><value>true</value></prop></item>
</oor:items>
"""


def main(argv: list[str]) -> int:
    """Limit this process and exec LibreOffice; returns only when the exec failed."""
    memory, file_bytes, seconds = int(argv[0]), int(argv[1]), int(float(argv[2]))
    soffice, export_filter, source = argv[3], argv[4], argv[5]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    private_tmp = _isolate()
    home = Path("/tmp/conduit-profile" if private_tmp else "profile").resolve()
    (home / "user").mkdir(parents=True, exist_ok=True)
    (home / "user" / "registrymodifications.xcu").write_text(_PROFILE)
    os.environ.update({"HOME": str(home), "TMPDIR": "/tmp" if private_tmp else os.getcwd()})
    os.execv(soffice, [
        soffice, f"-env:UserInstallation={home.as_uri()}", "--headless", "--invisible",
        "--nologo", "--nodefault", "--norestore", "--nolockcheck",
        "--convert-to", f"pdf:{export_filter}", "--outdir", "out", source])


def _isolate() -> bool:
    """Enter an empty network namespace and, as root, a mount namespace with a private
    `/tmp` (the working directory, already open, stays reachable); True when `/tmp` is
    private."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        if libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET) != 0:
            return False
    elif libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET) == 0:
        # the same user inside (files it writes stay the caller's), with the capabilities
        # a new user namespace gives to mount its own /tmp
        for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            Path(f"/proc/self/{name}").write_text(line)
    else:  # refused in many containers: LibreOffice runs with the system's /tmp
        return False
    work = os.open(".", os.O_RDONLY | os.O_DIRECTORY)  # the folder, before /tmp hides it
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0 or \
            libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                       _TMP_SIZE.encode()) != 0:
        return False
    os.mkdir(_WORK)  # the folder again, at a path in the new /tmp (LibreOffice's launcher
    # changes back to the directory it started in by name)
    if libc.mount(f"/proc/self/fd/{work}".encode(), _WORK.encode(), None, _MS_BIND,
                  None) != 0:
        raise OSError(ctypes.get_errno(), "cannot bind the work folder into the private /tmp")
    os.close(work)
    os.chdir(_WORK)
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

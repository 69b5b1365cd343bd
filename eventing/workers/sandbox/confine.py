"""What a sandboxed child does to itself before it runs anything (`confine`), in this order, while it has
one thread: it gives up every capability (a service running as root starts it as root: uid 0 with no
capability bypasses no file permission and raises no limit), takes its limits (memory, open files, file
size, no core files), restricts itself with Landlock to an allow-list of reads (`allowed_reads`: the
interpreter and the libraries it imports, the project's packages, system libraries, CA certificates, the
/etc files DNS and TLS read, time zones, its own /proc entry) and its private folder for writes
(landlock.py), and installs its system call filter (seccomp.py: no process, no program, no
Unix socket, no signal to another process). `sandbox_report` says in one line what this machine's sandbox
confines, for `eventing status`.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from typing import Any

from eventing.workers.sandbox.landlock import _libc, landlock_abi, restrict, sandbox_unavailable

# Read by a handler's process besides the interpreter, its sys.path and the project's packages: shared
# libraries and their loader's cache, CA certificates and OpenSSL's configuration, the files name
# resolution reads, time zones, locales, STPyV8's data, the random devices and the CPU count.
SYSTEM_READS = (
    "/lib",
    "/lib32",
    "/lib64",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/local/lib",
    "/etc/ld.so.cache",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/usr/share/ca-certificates",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust/extracted",
    "/usr/share/pki",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/localtime",
    "/etc/timezone",
    "/usr/share/zoneinfo",
    "/usr/share/locale",
    "/usr/share/stpyv8",
    "/dev/urandom",
    "/dev/random",
    "/sys/devices/system/cpu",
)
OPEN_FILES = 256  # RLIMIT_NOFILE: a worker holds a few dozen
FILE_MB = 1024  # RLIMIT_FSIZE: the largest file it may write in its private folder
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522


def _beneath(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _interpreter_reads() -> list[str]:
    """The folders of sys.path (the standard library, site-packages), the interpreter's `lib` folders (the
    shared libraries its extension modules load, as in a conda or pyenv installation) and the CA
    certificates of the OpenSSL that Python's ssl module uses."""
    import ssl  # loads OpenSSL, which starts no thread; the worker imports it anyway (curl)

    verify = ssl.get_default_verify_paths()
    return [
        *(entry or os.getcwd() for entry in sys.path),
        os.path.join(sys.base_prefix, "lib"),
        os.path.join(sys.base_exec_prefix, "lib"),
        *(p for p in (verify.cafile, verify.capath, verify.openssl_cafile, verify.openssl_capath) if p),
    ]


def allowed_reads(code: list[str], avoid: list[str]) -> list[str]:
    """What this process may read: SYSTEM_READS, the project's package folders `code`, its own /proc entry
    and what the interpreter reads (`_interpreter_reads`), each resolved (a link is allowed where it
    points). Of the interpreter's, one that is `/` or holds one of `avoid` (the data directory, the
    checkout, the home folder, Ray's folder, the other sandboxes) is left out: it would open them."""
    paths = [os.path.realpath(p) for p in (*SYSTEM_READS, *code)] + [f"/proc/{os.getpid()}"]
    for entry in _interpreter_reads():
        path = os.path.realpath(entry)
        if path == "/" or any(_beneath(os.path.realpath(a), path) for a in avoid):
            continue
        paths.append(path)
    return [p for p in dict.fromkeys(paths) if os.path.exists(p)]


def drop_capabilities() -> None:
    """Give up every capability, for good (a process without CAP_SETPCAP keeps the others' absence)."""
    for cap in range(64):
        if (
            _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22
        ):  # EINVAL: past the last
            break
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("=Ii", _CAPABILITY_VERSION_3, 0)
    if _libc.capset(header, bytes(24)) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def set_limits(memory_mb: int) -> None:
    """Memory (RLIMIT_DATA: what a process has made writable, its heap, V8's and every thread's stack; not
    the address space V8 reserves without using it), open files, the size of a file it writes, and no core
    file. Soft and hard alike: without capabilities they cannot be raised again."""
    import resource

    for limit, value in (
        (resource.RLIMIT_DATA, memory_mb << 20),
        (resource.RLIMIT_NOFILE, OPEN_FILES),
        (resource.RLIMIT_FSIZE, FILE_MB << 20),
        (resource.RLIMIT_CORE, 0),
    ):
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))


def confine(policy: dict[str, Any]) -> None:
    """Everything above, for the policy the host sent (see eventing.workers.sandbox). Call it before any
    thread exists; OSError when the kernel refuses a part (the child then runs nothing)."""
    from eventing.workers.sandbox import seccomp as sandbox_seccomp

    reads = allowed_reads(policy["code"], policy["avoid"])
    drop_capabilities()
    set_limits(policy["memory_mb"])
    restrict(read=reads, deny=policy["avoid"], writable=policy["writable"], tcp_ports=policy["tcp_ports"])
    sandbox_seccomp.install()


def sandbox_report() -> str:
    """One line: what a sandboxed handler's process is confined by on this machine, or why none can run."""
    why = sandbox_unavailable()
    if why:
        return f"unavailable: {why}"
    abi = landlock_abi()
    line = (
        f"Landlock ABI {abi} (reads by allow-list, writes in a private folder, TCP only to URL bindings' "
        "ports), a seccomp filter (no process, program, socket but IPv4/IPv6, shared memory without a "
        "file, or signal to another process), no "
        f"capabilities, limited memory and {OPEN_FILES} open files"
    )
    if abi < 5:
        line += "; this kernel's Landlock leaves ioctl on devices open (ABI 5, Linux 6.10, confines it)"
    return line

"""Landlock for sandboxed workers: the kernel's Landlock ABI (`landlock_abi`), why this machine cannot
sandbox (`sandbox_unavailable`), and `restrict`, which builds the ruleset (read only beneath the allowed
paths, less the denied ones; write only beneath the writable ones; execute nothing; TCP connects only to
given ports, no binding; from ABI 5 no ioctl on devices opened later, from ABI 6 no abstract Unix sockets or
signals outside the domain) and restricts the calling process with it, for good. Plain system calls through
ctypes; nothing here starts a thread.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on x86_64 and arm64
_VERSION = 1  # landlock_create_ruleset flag: answer the ABI version
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_MAKE = sum(1 << i for i in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, ABI 3, ABI 5
FS_MAKE_CHAR, FS_MAKE_SOCK, FS_MAKE_BLOCK = 1 << 6, 1 << 9, 1 << 11
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
MIN_ABI = 4  # files (1), renames across folders (2), truncation (3) and TCP (4) are all handled
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR  # handled (and so refused where no rule allows it)
READ_ONLY = FS_READ_FILE | FS_READ_DIR  # what a read rule allows: never FS_EXECUTE, so nothing is executed
WRITABLE = ~(
    FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_SOCK | FS_MAKE_BLOCK
)  # a writable folder: no devices, sockets
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE  # what a rule on a file may hold
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (too old, or disabled at boot)."""
    version = _libc.syscall(
        ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION)
    )
    return max(int(version), 0)


def sandbox_unavailable() -> str | None:
    """Why this machine cannot run sandboxed functions (one line), or None when it can."""
    if not sys.platform.startswith("linux"):
        return (
            f"sandboxed functions need Linux with Landlock (ABI {MIN_ABI}+, kernel 6.7+); this is "
            f"{sys.platform}"
        )
    abi = landlock_abi()
    if abi < MIN_ABI:
        found = f"ABI {abi}" if abi else "no Landlock (kernel too old, or `lsm=` at boot leaves it out)"
        return (
            f"sandboxed functions need Landlock ABI {MIN_ABI}+ (Linux 6.7+); this kernel has {found}: "
            'enable Landlock, or have an admin deploy the function with "isolation": "none"'
        )
    from eventing.workers.sandbox.seccomp import seccomp_unavailable

    why = seccomp_unavailable()
    return f"sandboxed functions need a system call filter: {why}" if why else None


def _read_rules(allowed: list[str], deny: list[str]) -> list[str]:
    """The paths to allow reading beneath: `allowed`, except that one holding a denied path is replaced
    by its entries, less the denied paths, folder by folder on the way to them (Landlock rules only
    allow). A denied path itself is never allowed; one beneath an allowed folder stays unreadable."""
    denied = {os.path.realpath(d) for d in deny}
    on_the_way = set()
    for d in denied:
        while d != "/":
            d = os.path.dirname(d)
            on_the_way.add(d)
    rules: list[str] = []
    folders: list[str] = []
    for path in dict.fromkeys(allowed):
        if path in denied:
            continue
        (folders if path in on_the_way else rules).append(path)
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.path in denied:
                continue
            if entry.path in on_the_way:
                folders.append(entry.path)
            elif not entry.is_symlink():  # a link is reached through what it points to, judged there
                rules.append(entry.path)
    return rules


def restrict(*, read: list[str], deny: list[str], writable: list[str], tcp_ports: list[int]) -> int:
    """Landlock this process (every thread it starts later, every child): read only beneath `read` (less
    `deny`), write only beneath `writable`, execute nothing, connect over TCP only to `tcp_ports`, bind
    none. Call it before any thread exists. Returns the ABI used; OSError when the kernel refuses."""
    abi = landlock_abi()
    if abi < MIN_ABI:
        raise OSError(sandbox_unavailable())
    handled_fs = READ | FS_WRITE_FILE | FS_MAKE | FS_REFER | FS_TRUNCATE | (FS_IOCTL_DEV if abi >= 5 else 0)
    attr = struct.pack(
        "=QQQ",
        handled_fs,
        NET_BIND_TCP | NET_CONNECT_TCP,
        SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if abi >= 6 else 0,
    )
    size = len(attr) if abi >= 6 else 16
    ruleset = _libc.syscall(ctypes.c_long(_CREATE_RULESET), attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        rules = [(p, READ_ONLY) for p in _read_rules(read, deny)]
        rules += [(p, handled_fs & WRITABLE) for p in writable]
        rules += [(p, FS_READ_FILE | FS_WRITE_FILE) for p in WRITABLE_DEVICES]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # gone meanwhile, or not ours to open: left unreadable
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    rights &= FILE_RIGHTS
                rule = struct.pack("=Qi", rights, fd)
                if (
                    _libc.syscall(
                        ctypes.c_long(_ADD_RULE),
                        ctypes.c_int(ruleset),
                        ctypes.c_int(_RULE_PATH_BENEATH),
                        rule,
                        ctypes.c_uint32(0),
                    )
                    < 0
                ):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        for port in sorted(set(tcp_ports)):
            rule = struct.pack("=QQ", NET_CONNECT_TCP, port)
            if (
                _libc.syscall(
                    ctypes.c_long(_ADD_RULE),
                    ctypes.c_int(ruleset),
                    ctypes.c_int(_RULE_NET_PORT),
                    rule,
                    ctypes.c_uint32(0),
                )
                < 0
            ):
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for TCP port {port}")
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if _libc.syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi

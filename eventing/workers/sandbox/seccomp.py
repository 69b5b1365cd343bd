"""The seccomp filter of a sandboxed child (`install`), for what Landlock does not cover: no process is
created (threads are), no program is executed, no socket but an IPv4 or IPv6 one is opened (a pathname
Unix socket, such as a Ray raylet's, cannot be reached through Landlock alone; a netlink one lists the
host's sockets), no memory is mapped shared without a file nor made with memfd (RLIMIT_DATA does not count
it), no signal goes to another process, nor a change of its
scheduling, priority or limits; no ptrace, no new namespace, mount, keyring, BPF program, perf event,
userfaultfd, io_uring, System V or POSIX IPC, and no TIOCSTI into an inherited terminal. A refused call fails
with EPERM (a new process's clone3 with ENOSYS, so threads fall back to clone, whose flags a filter can read);
a system call of another architecture's ABI (x32, or 32-bit through int 0x80) kills the process. The filter is
a classic BPF program built here, installed with prctl through ctypes; nothing here starts a thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_libc = ctypes.CDLL(None, use_errno=True)  # this module's own: landlock.py asks it what it lacks

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_KILL, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_AF_UNIX, _AF_INET, _AF_INET6, _SOCK_STREAM, _SOCK_TYPE_MASK = 1, 2, 10, 1, 0xF
_MAP_SHARED, _MAP_ANONYMOUS = 0x01, 0x20  # MAP_SHARED_VALIDATE (0x03) has MAP_SHARED's bit too
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

# System call numbers by architecture: (audit arch, x32 bit or 0, {name: number}).
_ARCHES = {
    "x86_64": (
        0xC000003E,
        0x40000000,
        {
            "ioctl": 16,
            "mmap": 9,
            "memfd_create": 319,
            "socket": 41,
            "socketpair": 53,
            "clone": 56,
            "fork": 57,
            "vfork": 58,
            "execve": 59,
            "kill": 62,
            "tkill": 200,
            "tgkill": 234,
            "rt_sigqueueinfo": 129,
            "rt_tgsigqueueinfo": 297,
            "execveat": 322,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "kcmp": 312,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "shmget": 29,
            "shmat": 30,
            "msgget": 68,
            "semget": 64,
            "mq_open": 240,
            "name_to_handle_at": 303,
            "open_by_handle_at": 304,
            "shmctl": 31,
            "semop": 65,
            "semctl": 66,
            "semtimedop": 220,
            "msgsnd": 69,
            "msgrcv": 70,
            "msgctl": 71,
            "setpriority": 141,
            "sched_setparam": 142,
            "sched_setscheduler": 144,
            "sched_setaffinity": 203,
            "ioprio_set": 251,
            "prlimit64": 302,
            "sched_setattr": 314,
        },
    ),
    "aarch64": (
        0xC00000B7,
        0,
        {
            "ioctl": 29,
            "mmap": 222,
            "memfd_create": 279,
            "socket": 198,
            "socketpair": 199,
            "clone": 220,
            "execve": 221,
            "kill": 129,
            "tkill": 130,
            "tgkill": 131,
            "rt_sigqueueinfo": 138,
            "rt_tgsigqueueinfo": 240,
            "execveat": 281,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "kcmp": 272,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "shmget": 194,
            "shmat": 196,
            "msgget": 186,
            "semget": 190,
            "mq_open": 180,
            "name_to_handle_at": 264,
            "open_by_handle_at": 265,
            "shmctl": 195,
            "semop": 193,
            "semctl": 191,
            "semtimedop": 192,
            "msgsnd": 189,
            "msgrcv": 188,
            "msgctl": 187,
            "setpriority": 140,
            "sched_setparam": 118,
            "sched_setscheduler": 119,
            "sched_setaffinity": 122,
            "ioprio_set": 30,
            "prlimit64": 261,
            "sched_setattr": 274,
        },
    ),
}
_COMMON = {  # the same numbers on both
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_open": 434,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "memfd_secret": 447,
}
_REFUSED = (
    "fork",
    "vfork",
    "execve",
    "execveat",
    "tkill",
    "pidfd_send_signal",
    "pidfd_open",
    "pidfd_getfd",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "shmget",
    "shmat",
    "shmctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "name_to_handle_at",
    "open_by_handle_at",
    # Memory outside RLIMIT_DATA's count (with a shared anonymous mmap, refused below): a handler could
    # otherwise take the machine's memory past its memory limit.
    "memfd_create",
    "memfd_secret",
)
_OWN_PID_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # first argument: a process id
# First argument: a process id, 0 for the caller. A process of the same uid (root's, when the service runs as
# root) could otherwise be slowed down, pinned to a core or have its limits changed.
_OWN_PID_OR_ZERO = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "prlimit64")
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1  # setpriority's and ioprio_set's "which": one process (not a uid)


def _arch() -> tuple[int, int, dict[str, int]] | None:
    found = _ARCHES.get(platform.machine())
    if found is None:
        return None
    audit, x32, numbers = found
    return audit, x32, {**numbers, **_COMMON}


def seccomp_unavailable() -> str | None:
    """Why this machine cannot filter a sandboxed child's system calls (one line), or None."""
    if _arch() is None:
        return (
            f"the sandbox's system call filter knows x86_64 and aarch64; this machine is {platform.machine()}"
        )
    # With a null program the kernel answers EFAULT where filters exist, EINVAL where they do not.
    if (
        _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, None, 0, 0) == 0
        or ctypes.get_errno() != errno.EFAULT
    ):
        return "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)"
    return None


def _stmt(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _arg(i: int) -> int:
    return 16 + 8 * i  # struct seccomp_data: nr, arch, instruction_pointer, args[6]; the low half first


def program(pid: int) -> bytes:
    """The filter as BPF instructions for this machine's architecture, for the process `pid`."""
    found = _arch()
    assert found is not None, seccomp_unavailable()
    audit, x32, nr = found
    eperm, allow = _RET_ERRNO | errno.EPERM, _RET_ALLOW
    out = [_stmt(_LD_W_ABS, 4), _stmt(_JEQ, audit, 1, 0), _stmt(_RET, _RET_KILL), _stmt(_LD_W_ABS, 0)]
    if x32:
        out += [_stmt(_JGE, x32, 0, 1), _stmt(_RET, _RET_KILL)]

    def when(name: str, block: list[bytes]) -> None:
        if name in nr:  # fork and vfork exist on x86_64 only
            out.extend([_stmt(_JEQ, nr[name], 0, len(block)), *block])

    for name in _REFUSED:
        when(name, [_stmt(_RET, eperm)])
    when("clone3", [_stmt(_RET, _RET_ERRNO | errno.ENOSYS)])
    when(
        "clone",
        [  # a thread (CLONE_THREAD) in no new namespace; never a process
            _stmt(_LD_W_ABS, _arg(0)),
            _stmt(_JSET, _CLONE_THREAD, 1, 0),
            _stmt(_RET, eperm),
            _stmt(_JSET, _CLONE_NAMESPACES, 0, 1),
            _stmt(_RET, eperm),
            _stmt(_RET, allow),
        ],
    )
    when(
        "socket",
        [  # IPv4 and IPv6 only: no Unix socket, and no netlink one (sock_diag lists every socket of the host)
            _stmt(_LD_W_ABS, _arg(0)),
            _stmt(_JEQ, _AF_INET, 1, 0),
            _stmt(_JEQ, _AF_INET6, 0, 1),
            _stmt(_RET, allow),
            _stmt(_RET, eperm),
        ],
    )
    when(
        "mmap",
        [  # shared anonymous memory is not counted by RLIMIT_DATA: refused, private mappings are not
            _stmt(_LD_W_ABS, _arg(3)),
            _stmt(_AND, _MAP_SHARED | _MAP_ANONYMOUS),
            _stmt(_JEQ, _MAP_SHARED | _MAP_ANONYMOUS, 0, 1),
            _stmt(_RET, eperm),
            _stmt(_RET, allow),
        ],
    )
    when(
        "socketpair",
        [  # a connected stream pair reaches no one; a datagram one could sendto() a path
            _stmt(_LD_W_ABS, _arg(0)),
            _stmt(_JEQ, _AF_UNIX, 0, 4),
            _stmt(_LD_W_ABS, _arg(1)),
            _stmt(_AND, _SOCK_TYPE_MASK),
            _stmt(_JEQ, _SOCK_STREAM, 1, 0),
            _stmt(_RET, eperm),
            _stmt(_RET, allow),
        ],
    )
    for name in _OWN_PID_ONLY:
        when(
            name, [_stmt(_LD_W_ABS, _arg(0)), _stmt(_JEQ, pid, 0, 1), _stmt(_RET, allow), _stmt(_RET, eperm)]
        )
    for name in _OWN_PID_OR_ZERO:
        when(
            name,
            [
                _stmt(_LD_W_ABS, _arg(0)),
                _stmt(_JEQ, 0, 2, 0),
                _stmt(_JEQ, pid, 1, 0),
                _stmt(_RET, eperm),
                _stmt(_RET, allow),
            ],
        )
    for name, one_process in (("setpriority", _PRIO_PROCESS), ("ioprio_set", _IOPRIO_WHO_PROCESS)):
        when(
            name,
            [
                _stmt(_LD_W_ABS, _arg(0)),
                _stmt(_JEQ, one_process, 0, 3),
                _stmt(_LD_W_ABS, _arg(1)),
                _stmt(_JEQ, 0, 2, 0),
                _stmt(_JEQ, pid, 1, 0),
                _stmt(_RET, eperm),
                _stmt(_RET, allow),
            ],
        )
    when(
        "ioctl",
        [
            _stmt(_LD_W_ABS, _arg(1)),
            _stmt(_JEQ, _TIOCSTI, 1, 0),
            _stmt(_JEQ, _TIOCLINUX, 0, 1),
            _stmt(_RET, eperm),
            _stmt(_RET, allow),
        ],
    )
    out.append(_stmt(_RET, allow))
    return b"".join(out)


def install() -> None:
    """Filter the calling thread's system calls (and every thread and child it starts later), for good.
    Needs no_new_privs (set by sandbox_landlock.restrict). OSError when the kernel refuses."""
    code = program(os.getpid())
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("=HxxxxxxQ", len(code) // 8, ctypes.addressof(buffer))
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

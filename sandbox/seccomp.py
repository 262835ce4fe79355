"""A seccomp-bpf deny-list, assembled here (no libseccomp dependency).

Why a deny-list of the kernel's attack surface rather than an allow-list: model-written Python calls a
wide and version-dependent set of syscalls; what it never needs is the kernel surface that escapes or
attacks a sandbox (sandbox.md §2): ptrace and `process_vm_*`, keyrings, bpf, perf, userfaultfd, io_uring,
mount and namespace calls, module/kexec loading, `open_by_handle_at`, TIOCSTI/TIOCLINUX ioctls, and every
socket family except AF_UNIX (which closes Landlock's UDP gap and makes egress impossible even where
no network namespace exists). `clone` with namespace flags is denied; `clone3` answers ENOSYS (its flags
live in memory BPF cannot read), so libc falls back to `clone`. Other architectures and the x32 ABI are
killed: a filter that cannot name the syscall must not guess.

The program is classic BPF: 8-byte `sock_filter` instructions, passed to bwrap via `--seccomp FD` or
installed by the process-mode child with `prctl(PR_SET_SECCOMP)`.
"""

from __future__ import annotations

import errno
import platform
import struct
from functools import cache

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000

# BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

# x86_64 syscall numbers.
DENIED_SYSCALLS_X86_64: dict[str, int] = {
    "uselib": 134, "personality": 135, "ptrace": 101, "syslog": 103, "vhangup": 153, "pivot_root": 155,
    "_sysctl": 156, "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249,
    "keyctl": 250, "unshare": 272, "move_pages": 279, "perf_event_open": 298, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "mount_setattr": 442,
}
SYS_SOCKET, SYS_SOCKETPAIR, SYS_IOCTL, SYS_CLONE, SYS_CLONE3 = 41, 53, 16, 56, 435

AF_UNIX = 1
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# struct seccomp_data offsets (little-endian: an argument's low 32 bits sit at its offset).
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    return 16 + 8 * index


class _Assembler:
    """Collects instructions with symbolic forward jump targets, then resolves the offsets."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (code, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                offset = target if isinstance(target, int) else self.labels[target] - index - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f"BPF jump out of range at {index}")
                offsets.append(offset)
            out += struct.pack("<HBBI", code, offsets[0], offsets[1], k & 0xFFFFFFFF)
        return bytes(out)


def supported() -> bool:
    """Whether a filter can be built for this machine's architecture."""
    return platform.machine() in ("x86_64", "AMD64")


@cache
def build_filter() -> bytes:
    """The deny-list program for x86_64 (raises `OSError` on other architectures)."""
    if not supported():
        raise OSError(errno.ENOSYS, f"no seccomp syscall table for {platform.machine()}")
    eperm = RET_ERRNO | errno.EPERM
    asm = _Assembler()
    asm.op(_LD_W_ABS, _ARCH)
    asm.op(_JEQ_K, AUDIT_ARCH_X86_64, 0, "kill")
    asm.op(_LD_W_ABS, _NR)
    asm.op(_JGE_K, X32_SYSCALL_BIT, "kill", 0)
    for number in sorted(DENIED_SYSCALLS_X86_64.values()):
        asm.op(_JEQ_K, number, "deny", 0)
    asm.op(_JEQ_K, SYS_SOCKET, "socket", 0)
    asm.op(_JEQ_K, SYS_SOCKETPAIR, "socket", 0)
    asm.op(_JEQ_K, SYS_IOCTL, "ioctl", 0)
    asm.op(_JEQ_K, SYS_CLONE, "clone", 0)
    asm.op(_JEQ_K, SYS_CLONE3, "enosys", 0)
    asm.op(_RET_K, RET_ALLOW)
    asm.label("socket")
    asm.op(_LD_W_ABS, _arg(0))
    asm.op(_JEQ_K, AF_UNIX, "allow", "deny")
    asm.label("ioctl")
    asm.op(_LD_W_ABS, _arg(1))
    asm.op(_JEQ_K, TIOCSTI, "deny", 0)
    asm.op(_JEQ_K, TIOCLINUX, "deny", "allow")
    asm.label("clone")
    asm.op(_LD_W_ABS, _arg(0))
    asm.op(_JSET_K, CLONE_NAMESPACE_FLAGS, "deny", "allow")
    asm.label("allow")
    asm.op(_RET_K, RET_ALLOW)
    asm.label("deny")
    asm.op(_RET_K, eperm)
    asm.label("enosys")
    asm.op(_RET_K, RET_ERRNO | errno.ENOSYS)
    asm.label("kill")
    asm.op(_RET_K, RET_KILL_PROCESS)
    return asm.assemble()

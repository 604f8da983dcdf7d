"""Which file systems are pseudo-filesystems: kernel interfaces that look like files.

search_files must not read them (issue 27): /proc/kmsg passes a regular-file check, and reading
it consumes the kernel log; /proc/self/environ holds the agent's secrets; a file of /sys or of
debugfs may block, change state when read, or never end. A search therefore skips every
directory and file whose device (`st_dev`) is that of a mount of one of `PSEUDO_FILESYSTEMS`,
as the mount table of the agent's own mount namespace, /proc/self/mountinfo, says.

Why st_dev against mountinfo and not statfs(2)'s f_type: Python has no statfs (os.statvfs
lacks f_type), and the device numbers come free with the stat the walk does anyway, so one
read of the mount table per search costs a few dozen microseconds in all, not a syscall per
file. The same st_dev is what mountinfo's third field names (major:minor). A device that is
not in the table (a btrfs subvolume, a mount made after the table was read) counts as a real
file system: a search reads it, as it would without this check.

Where /proc/self/mountinfo cannot be read (not Linux, or no /proc mounted) no device is known
to be a pseudo-filesystem.
"""

from __future__ import annotations

import os

# Kernel interfaces, never a user's files: the proc and sys trees, devices, control groups,
# debugging and tracing, security modules, firmware variables, kernel objects as files, and
# automount points (reading one triggers a mount, maybe of a network file system that hangs).
# tmpfs, ramfs, overlay, FUSE and network file systems hold real files and are not listed.
PSEUDO_FILESYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "cgroup",
        "cgroup2",
        "cpuset",
        "debugfs",
        "tracefs",
        "securityfs",
        "pstore",
        "bpf",
        "configfs",
        "efivarfs",
        "fusectl",
        "binfmt_misc",
        "mqueue",
        "hugetlbfs",
        "autofs",
        "selinuxfs",
        "smackfs",
        "apparmorfs",
        "nsfs",
        "rpc_pipefs",
        "nfsd",
        "resctrl",
        "sockfs",
        "pipefs",
        "anon_inodefs",
        "bdev",
    }
)

MOUNTINFO = "/proc/self/mountinfo"


def parse_mountinfo(text: str) -> dict[int, str]:
    """{st_dev: fstype} of the pseudo-filesystem mounts in a mountinfo table (proc(5)):
    ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw``: the third field is
    the device, the first after the ``-`` separator the file system type. Lines that do not
    parse are skipped."""
    devices: dict[int, str] = {}
    for line in text.splitlines():
        fields = line.split()
        try:
            separator = fields.index("-", 6)
            major, minor = fields[2].split(":")
            fstype = fields[separator + 1]
            device = os.makedev(int(major), int(minor))
        except (ValueError, IndexError):
            continue
        # "fuse.sshfs" is FUSE (real files); only an exact name of the list is a pseudo one.
        if fstype in PSEUDO_FILESYSTEMS:
            devices[device] = fstype
    return devices


class PseudoFilesystems:
    """The pseudo-filesystem devices mounted when `read` was called."""

    __slots__ = ("_devices",)

    def __init__(self, devices: dict[int, str]) -> None:
        self._devices = devices

    @classmethod
    def read(cls) -> PseudoFilesystems:
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
                return cls(parse_mountinfo(f.read()))
        except OSError:
            return cls({})

    def fstype(self, st_dev: int) -> str | None:
        """The pseudo-filesystem type of device `st_dev`, or None for a real file system."""
        return self._devices.get(st_dev)

"""What /proc says about processes and the TCP sockets they hold (Linux), for tests that
check which process serves a port or waits on a connection."""

from __future__ import annotations

import os
from pathlib import Path


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(entry.name))
    return found


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants (``sluice serve`` under pyvoy: the launcher and its Envoy)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo.extend(children(current) - found)
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def tcp_sockets() -> list[tuple[int, int, str, int, int]]:
    """Loopback TCP sockets: (local port, remote port, state, unread bytes, inode)."""
    out = []
    # tcp6 too: grpc's sockets are IPv6 ones, with IPv4-mapped loopback addresses.
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
            unread = int(fields[4].split(":")[1], 16)
            out.append((local, remote, fields[3], unread, int(fields[9])))
    return out

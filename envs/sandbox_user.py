"""An otherwise unused uid for a sandbox (the reasoning-gym scorer's one-shot children, envs/sandbox_server.py).

    uid = unused_id()   # None unless this process is root and an unused id can be found

The id is used as both uid and gid. It is picked at random among the ids this process's user namespace maps
(/proc/self/uid_map and gid_map: a container may map only a range), at or above MIN_ID and below 2**31 - 1, with no
passwd or group entry and no process running under it. Nothing reserves it: two sandboxes started at the same
moment could draw the same id, with a chance of about one in the size of the range (2**31 - MIN_ID in a container
that maps every id).
"""

from __future__ import annotations

import grp
import os
import pwd
import random

MIN_ID = 1 << 20
"""The lowest id drawn when the namespace maps enough ids above it (system and login ids are far below)."""
FALLBACK_MIN_ID = 10_000
"""The lowest id drawn otherwise (a container that maps only 65,536 ids)."""
_MAX_ID = (1 << 31) - 2  # below 2**31 - 1 and (uid_t)-1: some tools read ids as signed 32-bit numbers
_TRIES = 64


def mapped_ranges(path: str) -> list[tuple[int, int]]:
    """[(first, last)] of the ids a /proc/self/{uid,gid}_map maps inside this namespace ([] when unreadable)."""
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
        return [(int(r[0]), int(r[0]) + int(r[2]) - 1) for r in rows if len(r) == 3 and int(r[2]) > 0]
    except (OSError, ValueError):
        return []


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]], low: int) -> list[tuple[int, int]]:
    """Ids in both lists of ranges, from `low` to _MAX_ID."""
    out = []
    for a0, a1 in a:
        for b0, b1 in b:
            first, last = max(a0, b0, low), min(a1, b1, _MAX_ID)
            if first <= last:
                out.append((first, last))
    return out


def ids_in_use() -> set[int]:
    """Real and effective uids of the processes this process can see, and their owners in /proc."""
    used = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            used.add(os.stat(f"/proc/{name}").st_uid)
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        used.update(int(x) for x in line.split()[1:])
                        break
        except (OSError, ValueError):
            continue
    return used


def _named(i: int) -> bool:
    """Whether `i` has a passwd or a group entry."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(i)
            return True
        except (KeyError, OverflowError):
            pass
    return False


def unused_id(rng: random.Random | None = None) -> int | None:
    """A uid (and gid) no account, group or process uses, for a sandbox of this process; None when this process
    is not root (it could not switch to it) or no such id was found."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    rng = rng or random.SystemRandom()
    uids, gids = mapped_ranges("/proc/self/uid_map"), mapped_ranges("/proc/self/gid_map")
    ranges = _overlap(uids, gids, MIN_ID) or _overlap(uids, gids, FALLBACK_MIN_ID)
    if not ranges:
        return None
    used = ids_in_use()
    sizes = [last - first + 1 for first, last in ranges]
    for _ in range(_TRIES):
        first, last = rng.choices(ranges, weights=sizes)[0]
        i = rng.randint(first, last)
        if i not in used and not _named(i):
            return i
    return None

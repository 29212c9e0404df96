#!/usr/bin/env python3
"""A lock that one playbook run holds on the storage host while it changes the cluster.

Usage: lock.py take LOCK OWNER   exit 0: taken; exit 3: held, the holder's OWNER line on stdout
       lock.py release LOCK      removes it (nothing to remove is fine)
LOCK is a directory: mkdir is atomic, on NFS too. Nothing in it is opened through a link.
Standard library only: site.yml's cluster_lock role runs this file with the system's python3, before any venv
exists; train.yml's pre-flight (`dglkit control ready --lock`) imports it.
"""

import argparse
import os
import sys

HELD = 3


def take(lock: str, owner: str) -> str | None:
    """None when taken; else the holder's owner line."""
    os.makedirs(os.path.dirname(lock), mode=0o755, exist_ok=True)
    try:
        os.mkdir(lock, 0o755)
    except FileExistsError:
        try:
            fd = os.open(os.path.join(lock, "owner"), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as held:
                return held.read(1000).strip()
        except OSError:
            # Taken a moment ago, its owner not written yet (or a lock that lost it): still held.
            return f"owner unknown; {lock} exists"
    fd = os.open(os.path.join(lock, "owner"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as record:
        record.write(owner + "\n")
    return None


def release(lock: str) -> None:
    try:
        os.unlink(os.path.join(lock, "owner"))
    except FileNotFoundError:
        pass
    try:
        os.rmdir(lock)
    except FileNotFoundError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    taking = sub.add_parser("take", help="take the lock or print who holds it")
    taking.add_argument("lock")
    taking.add_argument("owner", help="who takes it: user, controller, what, when")
    sub.add_parser("release", help="release the lock").add_argument("lock")
    args = parser.parse_args()
    if args.action == "release":
        release(args.lock)
        sys.exit(0)
    holder = take(args.lock, args.owner)
    if holder is not None:
        print(holder)
        sys.exit(HELD)


if __name__ == "__main__":
    main()

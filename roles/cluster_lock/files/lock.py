#!/usr/bin/env python3
"""A lock that one playbook run holds on the storage host while it changes the cluster.

Usage: lock.py take LOCK OWNER   exit 0: taken; exit 3: held, the holder's OWNER line on stdout
       lock.py release LOCK      removes it (nothing to remove is fine)
LOCK is a directory: mkdir is atomic, on NFS too. Nothing in it is opened through a link.
"""

import argparse
import os
import sys

HELD = 3


def take(lock: str, owner: str) -> int:
    os.makedirs(os.path.dirname(lock), mode=0o755, exist_ok=True)
    try:
        os.mkdir(lock, 0o755)
    except FileExistsError:
        try:
            fd = os.open(os.path.join(lock, "owner"), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as held:
                print(held.read(1000).strip())
        except OSError:
            # Taken a moment ago, its owner not written yet (or a lock that lost it): still held.
            print(f"owner unknown; {lock} exists")
        return HELD
    fd = os.open(os.path.join(lock, "owner"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as record:
        record.write(owner + "\n")
    return 0


def release(lock: str) -> int:
    try:
        os.unlink(os.path.join(lock, "owner"))
    except FileNotFoundError:
        pass
    try:
        os.rmdir(lock)
    except FileNotFoundError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    taking = sub.add_parser("take", help="take the lock or print who holds it")
    taking.add_argument("lock")
    taking.add_argument("owner", help="who takes it: user, controller, what, when")
    sub.add_parser("release", help="release the lock").add_argument("lock")
    args = parser.parse_args()
    sys.exit(take(args.lock, args.owner) if args.action == "take" else release(args.lock))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Check the directories the kit creates, exports and chowns (workspace, venv, wheelhouse) for cluster_validate.

Usage: check_paths.py [--account-owned DIR ...] NAME=PATH ...   (an empty PATH is not set and passes)
Prints a JSON list of messages, one per bad path, each naming the setting, the path and the rule it breaks.
--account-owned names the directories the job account can change (its home, the workspace's job data): root
writes the kit's directories, so none of them may be there, nor anywhere every account can write (/tmp).
"""

import argparse
import json
import re

# Directories the system owns and that hold other directories: the kit's own must be below them, not them.
SHARED_DIRS = {"/home", "/media", "/mnt", "/opt", "/srv", "/tmp", "/var", "/var/backups", "/var/cache", "/var/lib",
               "/var/local", "/var/opt", "/var/tmp"}
# Trees the system owns: nothing of the kit belongs anywhere in them.
SYSTEM_TREES = ("/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/root", "/sbin", "/snap", "/usr",
                "/var/cache/apt", "/var/cache/debconf", "/var/lib/apt", "/var/lib/dpkg", "/var/lib/systemd",
                "/var/log", "/var/mail", "/var/spool")
# Kernel and runtime filesystems (and the links to them): gone at the next boot, or not files at all.
VOLATILE_TREES = ("/dev", "/proc", "/run", "/sys", "/var/lock", "/var/run")
# Directories every account can create files in (/dev/shm is under /dev above): whoever got there first decides
# what a path below them is, a link to /etc included.
WORLD_WRITABLE = ("/tmp", "/var/tmp")
EXAMPLE = "e.g. /srv/dglkit"


def within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree + "/")


def problem(name: str, path: str, account_owned: list[str]) -> str | None:
    """What is wrong with PATH as the kit's directory NAME, or None."""
    said = f"{name} '{path}'"
    if path == "/":
        return f"{said} is the root directory: use a directory of its own, {EXAMPLE}"
    if not re.fullmatch(r"/\S*[^/\s]", path):
        return f"{said} is not an absolute path without spaces: set it to e.g. /srv/dglkit"
    if {"", ".", ".."} & set(path.split("/")[1:]):
        return f"{said} has an empty, '.' or '..' component: write the real path, {EXAMPLE}"
    if path in SHARED_DIRS:
        return f"{said} is a system directory: use a directory of its own, {EXAMPLE}"
    for tree in VOLATILE_TREES:
        if within(path, tree):
            return f"{said} is on a kernel or runtime filesystem ({tree}): use a directory on disk, {EXAMPLE}"
    for tree in SYSTEM_TREES:
        if within(path, tree):
            return f"{said} is inside {tree}, a system directory: use a directory of its own, {EXAMPLE}"
    for tree in WORLD_WRITABLE:
        if within(path, tree):
            return (f"{said} is inside {tree}, where every account can create files (a link planted there would "
                    f"lead root's writes anywhere): use a directory of its own, {EXAMPLE}")
    for tree in account_owned:
        if within(path, tree):
            return (f"{said} is inside {tree}, which the job account can change (root would write through what "
                    f"it puts there): use a directory of its own, {EXAMPLE}")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--account-owned", action="append", default=[], metavar="DIR")
    parser.add_argument("paths", nargs="*", metavar="NAME=PATH")
    args = parser.parse_args()
    named = (pair.partition("=")[::2] for pair in args.paths)
    print(json.dumps([message for name, path in named
                      if path and (message := problem(name, path, args.account_owned))]))


if __name__ == "__main__":
    main()

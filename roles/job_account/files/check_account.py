"""Check that the job account can have the kit's ids on this node, and whether it already is as the kit makes it.

Usage: check_account.py USER UID GID HOME
Prints one JSON object: "errors", the reasons the account cannot be made here (empty: it can), and "current",
true when the account, its group, its home's Ansible directories and its expiry are exactly what the job_account
role would make (the role then has nothing to do). A lookup by id answers with the first holder only, so the
databases are also read whole (every holder in the sources that list their entries).
"""

import grp
import json
import os
import pwd
import stat
import sys


def holders(by_id: list[str], everyone: list[str], name: str) -> list[str]:
    """Everyone else who holds an id, the direct lookup's answer first."""
    return [n for n in dict.fromkeys(by_id + everyone) if n != name]


def current(user: str, uid: int, gid: int, home: str) -> bool:
    try:
        entry, group = pwd.getpwnam(user), grp.getgrnam(user)
        with open("/etc/shadow") as shadow:
            fields = next((line.split(":") for line in shadow if line.split(":")[0] == user), None)
        dirs = [os.lstat(path) for path in (home, f"{home}/.ansible", f"{home}/.ansible/tmp")]
    except (KeyError, OSError):
        return False
    return ((entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_shell) == (uid, gid, home, "/bin/bash")
            and group.gr_gid == gid and fields is not None and len(fields) > 7 and fields[7] == ""
            and stat.S_ISDIR(dirs[0].st_mode)
            and all(stat.S_ISDIR(d.st_mode) and (d.st_uid, d.st_gid, stat.S_IMODE(d.st_mode)) == (uid, gid, 0o700)
                    for d in dirs[1:]))


def main() -> None:
    user, uid, gid, home = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    errors = []
    try:
        entry = pwd.getpwnam(user)
        if (entry.pw_uid, entry.pw_gid) != (uid, gid):
            errors.append(f"account {user} exists with uid {entry.pw_uid} and gid {entry.pw_gid}, but the kit needs uid "
                          f"{uid} and gid {gid} on every node: set dglkit_user_uid and dglkit_user_gid to its ids if they "
                          "are the same on every node, else change the account (usermod -u, groupmod -g) or pick another "
                          "dglkit_user")
    except KeyError:
        pass
    try:
        by_uid = [pwd.getpwuid(uid).pw_name]
    except KeyError:
        by_uid = []
    others = holders(by_uid, [p.pw_name for p in pwd.getpwall() if p.pw_uid == uid], user)
    if others:
        errors.append(f"uid {uid} belongs to the account{'s' if len(others) > 1 else ''} {', '.join(others)}: "
                      "set dglkit_user_uid to a uid that is free on every node")
    try:
        group = grp.getgrnam(user)
        if group.gr_gid != gid:
            errors.append(f"group {user} exists with gid {group.gr_gid}, but the kit needs gid {gid} on every node: set "
                          "dglkit_user_gid to it if it is the same on every node, else change the group (groupmod -g) "
                          "or pick another dglkit_user")
    except KeyError:
        pass
    try:
        by_gid = [grp.getgrgid(gid).gr_name]
    except KeyError:
        by_gid = []
    others = holders(by_gid, [g.gr_name for g in grp.getgrall() if g.gr_gid == gid], user)
    if others:
        errors.append(f"gid {gid} belongs to the group{'s' if len(others) > 1 else ''} {', '.join(others)}: "
                      "set dglkit_user_gid to a gid that is free on every node")
    print(json.dumps({"errors": errors, "current": not errors and current(user, uid, gid, home)}))


if __name__ == "__main__":
    main()

"""What the SSH mesh role needs to know about a node, in one round trip.

Usage: probe.py USER KEY_NAME COMMENT KNOWN_HOSTS CLIENT_CONFIG
Prints one JSON object: the account's home ("" without the account), this node's SSH host keys
(first two fields of each line), whether anything of an earlier kit version's root key is left (legacy) and
whether anything of the mesh is there to remove (present). The account's .ssh is looked at through a descriptor
opened from its home without following a link, and a file in it is read only when it is a regular file of the
account's with one name (never blocking on a FIFO): root must not read what a job planted there. The role changes
the account's files as the account (job_account's files/home.py).
"""

import glob
import json
import os
import pwd
import stat
import sys

FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def read(path: str, dir_fd: int | None = None, owner: int | None = None) -> str | None:
    """A regular file's text (of owner, with one name, when owner is given), else None."""
    try:
        fd = os.open(path, FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, errors="replace") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or owner is not None and (st.st_uid, st.st_nlink) != (owner, 1):
            return None
        return f.read(100_000)


def key_fields(line: str) -> str:
    return " ".join(line.split()[:2])


def mesh_in_home(entry: pwd.struct_passwd, key_name: str, comment: str) -> bool:
    """Whether the account's .ssh holds the mesh's key pair or lines."""
    try:
        home = os.open(entry.pw_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        ssh = os.open(".ssh", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=home)
    except OSError:
        # Not a directory: a link or anything else there is removed by the account (home.py unmesh).
        return os.path.lexists(f"{entry.pw_dir}/.ssh")
    finally:
        os.close(home)
    try:
        names = set(os.listdir(ssh))
        authorized = read("authorized_keys", ssh, entry.pw_uid) if "authorized_keys" in names else None
    finally:
        os.close(ssh)
    return (bool({key_name, f"{key_name}.pub"} & names)
            or any(line.split()[-2:-1] == [comment] for line in (authorized or "").splitlines())
            or authorized is None and "authorized_keys" in names)


def main() -> None:
    user, key_name, comment, known_hosts, client_config = sys.argv[1:6]
    try:
        entry: pwd.struct_passwd | None = pwd.getpwnam(user)
    except KeyError:
        entry = None
    root_keys = read(os.path.expanduser("~root/.ssh/authorized_keys")) or ""
    root_key = os.path.expanduser(f"~root/.ssh/{key_name}")
    print(json.dumps({
        "home": entry.pw_dir if entry else "",
        "host_keys": [key_fields(read(path) or "") for path in sorted(glob.glob("/etc/ssh/ssh_host_*_key.pub"))],
        "legacy": any(line.endswith(" dglkit cluster key") for line in root_keys.splitlines())
        or any(os.path.lexists(p) for p in (root_key, f"{root_key}.pub")),
        "present": any(os.path.lexists(p) for p in (known_hosts, client_config))
        or entry is not None and mesh_in_home(entry, key_name, comment),
    }))


if __name__ == "__main__":
    main()

"""What the SSH mesh role needs to know about a node, in one round trip.

Usage: probe.py USER KEY_NAME COMMENT KNOWN_HOSTS CLIENT_CONFIG
Prints one JSON object: the account's home and gid ("" and null without the account), this node's public key of
the mesh (and whether its private key is there) and its SSH host keys (first two fields of each line), whether
anything of an earlier kit version's root key is left (legacy) and whether anything of the mesh is there to remove
(present). Files in the account's home are opened without following a link at their last component: root must not
read what a job planted there.
"""

import glob
import json
import os
import pwd
import sys


def read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, errors="replace") as f:
        return f.read(100_000)


def key_fields(line: str) -> str:
    return " ".join(line.split()[:2])


def main() -> None:
    user, key_name, comment, known_hosts, client_config = sys.argv[1:6]
    try:
        entry = pwd.getpwnam(user)
        home, gid = entry.pw_dir, entry.pw_gid
    except KeyError:
        home, gid = "", None
    key = f"{home}/.ssh/{key_name}" if home else ""
    public = read(f"{key}.pub") if home else None
    authorized = (read(f"{home}/.ssh/authorized_keys") or "") if home else ""
    root_keys = read(os.path.expanduser("~root/.ssh/authorized_keys")) or ""
    root_key = os.path.expanduser(f"~root/.ssh/{key_name}")
    mesh_files = [key, f"{key}.pub"] if home else []
    print(json.dumps({
        "home": home,
        "gid": gid,
        "private_key": bool(key) and os.path.lexists(key),
        "public_key": key_fields(public) if public else None,
        "host_keys": [key_fields(read(path) or "") for path in sorted(glob.glob("/etc/ssh/ssh_host_*_key.pub"))],
        "legacy": any(line.endswith(" dglkit cluster key") for line in root_keys.splitlines())
        or any(os.path.lexists(p) for p in (root_key, f"{root_key}.pub")),
        "present": any(os.path.lexists(p) for p in [*mesh_files, known_hosts, client_config])
        or any(line.split()[-2:-1] == [comment] for line in authorized.splitlines()),
    }))


if __name__ == "__main__":
    main()

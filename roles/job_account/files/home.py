"""The kit's files in the job account's home, made, changed and removed by the account itself.

Usage: home.py USER [--check] COMMAND ARGS...
  dirs REL...            each a directory of the account's, mode 0700 (with its parents)
  key NAME COMMENT       .ssh/ and the ed25519 key pair .ssh/NAME, .ssh/NAME.pub; prints the public key
  authorize              .ssh/authorized_keys, mode 0600, holds what stdin holds
  unmesh NAME COMMENT    the lines of .ssh/authorized_keys that end in " COMMENT <host>" and the key pair removed
  remove REL             REL removed, whatever it is (a directory with everything in it)
Prints one JSON object: "changed", "replaced" (what was in the way: not what the kit makes at that name, named
with what it was, removed and made again) and, for key, "public_key". --check reports and changes nothing.

Root runs it, and it becomes the account (its uid, gid and groups, for good) before it touches any path in the
home: whatever the account planted there (a link to /etc, a FIFO, a hard link) is met with the account's rights
only. Files are opened without following a link and without blocking (O_NOFOLLOW, O_NONBLOCK), and read only when
they are regular files of the account's with one name.
"""

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys

AUTHORIZED = ".ssh/authorized_keys"


def kind(st: os.stat_result, uid: int) -> str:
    """What a file is, for a message."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a directory")):
        if test(st.st_mode):
            return name
    if st.st_nlink > 1:
        return f"a hard link: {st.st_nlink} names"
    return "a regular file" if st.st_uid == uid else f"a file of uid {st.st_uid}"


class Home:
    """The account's home, as the account: every change goes through here, and --check only records it."""

    def __init__(self, entry: pwd.struct_passwd, check: bool) -> None:
        self.home, self.uid, self.check = entry.pw_dir, entry.pw_uid, check
        self.changed = False
        self.replaced: list[str] = []

    def path(self, rel: str) -> str:
        return os.path.join(self.home, rel)

    def look(self, rel: str) -> os.stat_result | None:
        try:
            return os.lstat(self.path(rel))
        except FileNotFoundError:
            return None

    def is_own_file(self, st: os.stat_result | None) -> bool:
        return st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == self.uid

    def change(self) -> bool:
        """Record a change; whether to make it (not in check mode)."""
        self.changed = True
        return not self.check

    def remove(self, rel: str, in_the_way: bool = True) -> None:
        st = self.look(rel)
        if st is None:
            return
        if in_the_way:
            self.replaced.append(f"{self.path(rel)} ({kind(st, self.uid)})")
        if self.change():
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(self.path(rel))
            else:
                os.unlink(self.path(rel))

    def directory(self, rel: str) -> None:
        """REL and its parents: directories of the account's, mode 0700."""
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            sub = "/".join(parts[:depth])
            st = self.look(sub)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                self.remove(sub)
                st = None
            if st is None:
                if self.change():
                    os.mkdir(self.path(sub), 0o700)
            elif st.st_uid != self.uid:
                sys.exit(f"{self.path(sub)} is a directory of uid {st.st_uid}, not of the job account: "
                         "remove it and run the playbook again")
            elif stat.S_IMODE(st.st_mode) != 0o700 and self.change():
                os.chmod(self.path(sub), 0o700)

    def read(self, rel: str) -> str | None:
        """The text of REL when it is a regular file of the account's with one name, else None."""
        try:
            fd = os.open(self.path(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, errors="replace") as f:
            return f.read(1_000_000) if self.is_own_file(os.fstat(fd)) else None

    def write(self, rel: str, text: str) -> None:
        """REL holds TEXT, mode 0600: a new file renamed over the name when it differs."""
        st = self.look(rel)
        if st is not None and self.is_own_file(st) and stat.S_IMODE(st.st_mode) == 0o600 and self.read(rel) == text:
            return
        if st is not None and not self.is_own_file(st):
            self.remove(rel)
        if not self.change():
            return
        self.remove(f"{rel}.dglkit-partial", in_the_way=False)
        partial = self.path(f"{rel}.dglkit-partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(fd)
        os.replace(partial, self.path(rel))


def key(home: Home, name: str, comment: str) -> dict:
    home.directory(".ssh")
    private, public = f".ssh/{name}", f".ssh/{name}.pub"
    made = home.is_own_file(home.look(private)) and home.is_own_file(home.look(public))
    if not made:
        # A pair is made whole: anything else at either name goes (a key of this node's is worth nothing elsewhere).
        for rel in (private, public):
            home.remove(rel, in_the_way=not home.is_own_file(home.look(rel)))
        if home.change():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", home.path(private)],
                           check=True, stdin=subprocess.DEVNULL)
    text = home.read(public) if made or not home.check else None
    return {"public_key": " ".join(text.split()[:2]) if text else None}


def unmesh(home: Home, name: str, comment: str) -> dict:
    st = home.look(".ssh")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        home.remove(".ssh")
        return {}
    if home.look(AUTHORIZED) is not None:
        text = home.read(AUTHORIZED)
        if text is None:
            home.remove(AUTHORIZED)
        else:
            kept = [line for line in text.splitlines(keepends=True) if line.split()[-2:-1] != [comment]]
            if kept != text.splitlines(keepends=True):
                home.write(AUTHORIZED, "".join(kept))
    for rel in (f".ssh/{name}", f".ssh/{name}.pub"):
        home.remove(rel, in_the_way=False)
    return {}


def become(entry: pwd.struct_passwd) -> None:
    """The account's uid, gid and groups for good (real, effective and saved); files it makes are its own alone."""
    os.initgroups(entry.pw_name, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    os.umask(0o077)
    if not os.path.isdir(entry.pw_dir):
        sys.exit(f"{entry.pw_dir}, the home of account {entry.pw_name}, is not a directory: site.yml makes it")


def main() -> None:
    user, args = sys.argv[1], sys.argv[2:]
    check = args[:1] == ["--check"]
    command, *rest = args[1:] if check else args
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        if check:  # a check-mode run before the account is made: all of it is to be made
            print(json.dumps({"changed": True, "replaced": [], "public_key": None}))
            return
        sys.exit(f"account {user} does not exist: site.yml creates it (dglkit_user)")
    if entry.pw_uid == 0:
        sys.exit(f"account {user} is root: the kit's files in a home are for the unprivileged job account alone")
    become(entry)
    home = Home(entry, check)
    found: dict = {}
    if command == "dirs":
        for rel in rest:
            home.directory(rel)
    elif command == "key":
        found = key(home, *rest)
    elif command == "authorize":
        home.directory(".ssh")
        home.write(AUTHORIZED, sys.stdin.read().rstrip("\n") + "\n")
    elif command == "unmesh":
        found = unmesh(home, *rest)
    elif command == "remove":
        home.remove(rest[0], in_the_way=False)
    else:
        sys.exit(f"unknown command {command}")
    print(json.dumps({"changed": home.changed, "replaced": home.replaced, **found}))


if __name__ == "__main__":
    main()

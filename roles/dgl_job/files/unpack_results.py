#!/usr/bin/env python3
"""Unpack a job's results archive (`dglkit pack`) into its run folder on the controller.

Usage: unpack_results.py RUN_FOLDER [ARCHIVE]
The archive is the file ARCHIVE (the controller's copy, fetched for this, removed afterwards) or, without it, the
base64 on standard input (`dglkit pack`'s "archive_base64"). The run folder is made when missing.
The archive comes from a directory the job could write, so it is not trusted: only regular-file members with
relative names that stay inside the run folder are written; links, hard links, devices, FIFOs, absolute names
and names with ".." are left out and named. Nothing is written through a link: directories are entered by
descriptor with O_NOFOLLOW (a link or file in the way is replaced by a directory), and each file goes to a new
temporary file that is renamed over its name. A file whose size and modification time match is not written
again. Prints one JSON line: {"changed", "files", "written", "skipped"}.
"""

import base64
import io
import json
import os
import stat
import sys
import tarfile
import typing

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def enter(parent: int, name: str) -> int:
    """The directory `name` in parent, made when missing; anything else in its place is removed first."""
    try:
        return os.open(name, DIRECTORY, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError:  # ELOOP (a link) or ENOTDIR (a file): not ours to follow
        os.unlink(name, dir_fd=parent)
    os.mkdir(name, 0o755, dir_fd=parent)
    return os.open(name, DIRECTORY, dir_fd=parent)


def unchanged(fd: int, name: str, member: tarfile.TarInfo) -> bool:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == member.size and int(st.st_mtime) == member.mtime


def write(fd: int, name: str, member: tarfile.TarInfo, data) -> None:
    tmp = f".{name}.unpacking"
    try:
        os.unlink(tmp, dir_fd=fd)
    except FileNotFoundError:
        pass
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
    with os.fdopen(out, "wb") as f:
        while chunk := data.read(1 << 20):
            f.write(chunk)
        f.flush()
        os.utime(f.fileno(), (member.mtime, member.mtime))
    os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)


def problem(member: tarfile.TarInfo) -> str:
    """Why a member is left out, or "" to write it."""
    parts = member.name.split("/")
    if member.name.startswith("/") or ".." in parts or not member.name.strip("/"):
        return "a name outside the run folder"
    if not member.isreg():
        kinds = [(member.issym, "a symbolic link"), (member.islnk, "a hard link"), (member.isdir, "a directory"),
                 (member.isfifo, "a FIFO"), (member.isdev, "a device")]
        return next((kind for test, kind in kinds if test()), "not a regular file")
    return ""


def unpack(archive: typing.BinaryIO, dest: str) -> dict:
    files, written, skipped = 0, 0, []
    os.makedirs(dest, 0o755, exist_ok=True)
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with tarfile.open(fileobj=archive) as tar:
            for member in tar:
                reason = problem(member)
                if reason:
                    if not member.isdir():
                        skipped.append(f"{member.name} ({reason})")
                    continue
                *dirs, name = [part for part in member.name.split("/") if part not in ("", ".")]
                fds = [root]
                try:
                    for part in dirs:
                        fds.append(enter(fds[-1], part))
                    files += 1
                    if not unchanged(fds[-1], name, member):
                        write(fds[-1], name, member, tar.extractfile(member))
                        written += 1
                except OSError as error:  # e.g. a directory of an earlier run where this file goes
                    skipped.append(f"{member.name} ({error.strerror})")
                finally:
                    for fd in fds[1:]:
                        os.close(fd)
    finally:
        os.close(root)
    return {"changed": written > 0, "files": files, "written": written, "skipped": skipped}


if __name__ == "__main__":
    if len(sys.argv) > 2:
        try:
            with open(sys.argv[2], "rb") as fetched:
                print(json.dumps(unpack(fetched, sys.argv[1])))
        finally:
            os.unlink(sys.argv[2])
    else:
        print(json.dumps(unpack(io.BytesIO(base64.b64decode(sys.stdin.buffer.read())), sys.argv[1])))

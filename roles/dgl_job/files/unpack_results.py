#!/usr/bin/env python3
"""Unpack a job's results archive (`dglkit pack`) as its run folder on the controller.

Usage: unpack_results.py RUN_FOLDER [ARCHIVE]
The archive is the file ARCHIVE (the controller's copy, fetched for this, removed afterwards) or, without it, the
base64 on standard input (`dglkit pack`'s "archive_base64").
The run folder becomes exactly the archive: the job's current files, and its earlier runs under history/<k>/ as the
storage host keeps them. Nothing of an earlier unpack stays beside them (a re-run's new files never sit next to the
run before's FAILED, attempts/ or outputs). It is built beside the run folder (.<name>.unpacking) and renamed over
it, so an unpack that is interrupted leaves the earlier run folder or the new one, never a mix; the next unpack
finishes or undoes a swap that was cut short. A file whose size and modification time match the earlier run
folder's is linked from it, not written again, and an unchanged job changes nothing. An earlier run folder holding
a file that the new one has neither at its path nor, moved there by a re-run, under history/<k>/ (the job
directory was removed, the user added it) is kept whole as <name>.replaced-<n>, and named.
The archive comes from a directory the job could write, so it is not trusted: only regular-file members with
relative names that stay inside the run folder are written; links, hard links, devices, FIFOs, absolute names
and names with ".." are left out and named. Nothing is written through a link: directories are entered by
descriptor with O_NOFOLLOW, and each file goes to a new temporary file that is renamed over its name.
Prints one JSON line: {"changed", "files", "written", "skipped", "kept"}.
"""

import base64
import io
import json
import os
import shutil
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


def tree(fd: int, prefix: str = "") -> dict[str, os.stat_result]:
    """Everything below a directory but directories, by relative path, without following a link."""
    found = {}
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            found[prefix + name] = st
            continue
        sub = os.open(name, DIRECTORY, dir_fd=fd)
        try:
            found.update(tree(sub, prefix + name + "/"))
        finally:
            os.close(sub)
    return found


def reuse(earlier: int | None, dirs: list[str], name: str, member: tarfile.TarInfo, fd: int) -> bool:
    """Link the earlier run folder's copy of the member into fd when it is the same file (size and time): at the
    same path, or, for history/<k>/<path>, at <path> (a re-run moved it there on the storage host)."""
    sources = [dirs] + ([dirs[2:]] if dirs[:1] == ["history"] and len(dirs) > 1 else [])
    return earlier is not None and any(link_from(earlier, source, name, member, fd) for source in sources)


def link_from(earlier: int, dirs: list[str], name: str, member: tarfile.TarInfo, fd: int) -> bool:
    fds: list[int] = []
    try:
        for part in dirs:
            fds.append(os.open(part, DIRECTORY, dir_fd=fds[-1] if fds else earlier))
        source = fds[-1] if fds else earlier
        if not unchanged(source, name, member):
            return False
        os.link(name, name, src_dir_fd=source, dst_dir_fd=fd, follow_symlinks=False)
        return True
    except OSError:  # no such directory there, or a filesystem without hard links: written instead
        return False
    finally:
        for opened in fds:
            os.close(opened)


# The controller's own files in a run folder (app/dglkit/tboard.py's TensorBoard event files, at its top and under
# history/<k>/): no archive has them, so every unpack carries them over from the earlier run folder.
CONTROLLER_FILES = "events.out.tfevents."


def subdir(parent: int, name: str, make: bool) -> int:
    """The directory `name` in parent, without following a link; made when missing and `make`."""
    try:
        return os.open(name, DIRECTORY, dir_fd=parent)
    except FileNotFoundError:
        if not make:
            raise
    os.mkdir(name, 0o755, dir_fd=parent)
    return os.open(name, DIRECTORY, dir_fd=parent)


def walk(root: int, dirs: list[str], make: bool, opened: list[int]) -> int:
    """The directory root/dirs/..., each entered as subdir() does; every descriptor opened goes into `opened`."""
    fd = root
    for part in dirs:
        fd = subdir(fd, part, make)
        opened.append(fd)
    return fd


def carry_over(earlier: int, found: dict[str, os.stat_result], staging: int) -> None:
    """Link the controller's own files of the earlier run folder into the new one, where the archive put nothing
    in their place."""
    for path, st in found.items():
        *dirs, name = path.split("/")
        if not (name.startswith(CONTROLLER_FILES) and stat.S_ISREG(st.st_mode)):
            continue
        opened: list[int] = []
        try:
            source, target = walk(earlier, dirs, False, opened), walk(staging, dirs, True, opened)
            os.link(name, name, src_dir_fd=source, dst_dir_fd=target, follow_symlinks=False)
        except OSError:  # the archive has a file of that name, or a file where a directory would be: it wins
            pass
        finally:
            for fd in opened:
                os.close(fd)


def build(archive: typing.BinaryIO, staging: int, earlier: int | None) -> tuple[int, list[str]]:
    """The archive's regular files in the staging directory; (how many were written, what was left out)."""
    written, skipped = 0, []
    with tarfile.open(fileobj=archive) as tar:
        for member in tar:
            reason = problem(member)
            if reason:
                if not member.isdir():
                    skipped.append(f"{member.name} ({reason})")
                continue
            *dirs, name = [part for part in member.name.split("/") if part not in ("", ".")]
            fds = [staging]
            try:
                for part in dirs:
                    fds.append(enter(fds[-1], part))
                if not reuse(earlier, dirs, name, member, fds[-1]):
                    write(fds[-1], name, member, tar.extractfile(member))
                    written += 1
            except OSError as error:
                skipped.append(f"{member.name} ({error.strerror})")
            finally:
                for fd in fds[1:]:
                    os.close(fd)
    return written, skipped


def unaccounted(earlier: dict[str, os.stat_result], new: dict[str, os.stat_result]) -> list[str]:
    """The earlier run folder's files that the new one holds neither at their path nor under history/<k>/ (the
    same size and time: a re-run moved them there on the storage host)."""
    moved = {(path.split("/", 2)[2], st.st_size, int(st.st_mtime)) for path, st in new.items()
             if path.startswith("history/") and path.count("/") >= 2}
    return sorted(path for path, st in earlier.items() if stat.S_ISREG(st.st_mode) and path not in new
                  and (path, st.st_size, int(st.st_mtime)) not in moved)


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)  # never follows a link below it
    else:
        os.unlink(path)


def recover(dest: str, aside: str, staging: str) -> None:
    """Finish or undo what an interrupted unpack left: the earlier run folder moved aside and not replaced comes
    back; one that was replaced goes, and so does a half-built new one."""
    if os.path.lexists(aside):
        if os.path.lexists(dest):
            remove(aside)
        else:
            os.rename(aside, dest)
    if os.path.lexists(staging):
        remove(staging)


def open_earlier(dest: str) -> int | None:
    try:
        return os.open(dest, DIRECTORY)
    except OSError:  # none yet, or not a directory: nothing to keep or reuse
        return None


def unpack(archive: typing.BinaryIO, dest: str) -> dict:
    dest = os.path.abspath(dest)
    parent, name = os.path.split(dest)
    aside, staging = os.path.join(parent, f".{name}.replaced"), os.path.join(parent, f".{name}.unpacking")
    os.makedirs(parent, 0o755, exist_ok=True)
    recover(dest, aside, staging)
    os.mkdir(staging, 0o755)
    built = os.open(staging, DIRECTORY)
    earlier_fd = open_earlier(dest)
    try:
        written, skipped = build(archive, built, earlier_fd)
        earlier = tree(earlier_fd) if earlier_fd is not None else {}
        if earlier_fd is not None:
            carry_over(earlier_fd, earlier, built)
        new = tree(built)
    except BaseException:  # a broken archive, an interrupt: the run folder stays as it was
        remove(staging)
        raise
    finally:
        os.close(built)
        if earlier_fd is not None:
            os.close(earlier_fd)
    result = {"files": len(new), "written": written, "skipped": skipped}
    if os.path.isdir(dest) and not os.path.islink(dest) and not written and earlier.keys() == new.keys() \
            and all(stat.S_ISREG(st.st_mode) for st in earlier.values()):
        remove(staging)
        return {"changed": False, **result, "kept": None}
    kept = None
    if unaccounted(earlier, new):
        kept = next(path for n in range(1, 1 << 20) if not os.path.lexists(path := f"{dest}.replaced-{n}"))
    if os.path.lexists(dest):
        os.rename(dest, kept or aside)
    os.rename(staging, dest)
    if os.path.lexists(aside):
        remove(aside)
    return {"changed": True, **result, "kept": kept}


if __name__ == "__main__":
    if len(sys.argv) > 2:
        try:
            with open(sys.argv[2], "rb") as fetched:
                print(json.dumps(unpack(fetched, sys.argv[1])))
        finally:
            os.unlink(sys.argv[2])
    else:
        print(json.dumps(unpack(io.BytesIO(base64.b64decode(sys.stdin.buffer.read())), sys.argv[1])))

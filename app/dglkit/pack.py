"""`dglkit pack`: a job directory's results as one tar archive, for the controller's run folder.

The job wrote its directory, so it may have put anything there: a symbolic link to a file it cannot read
itself, a FIFO that blocks whoever opens it, a hard link, a directory where a file was. The archive holds
regular files alone, each opened without following a link (O_NOFOLLOW, from a directory descriptor opened the
same way) and without blocking; every other entry that the selection names is left out and named in a
warning (stderr, and "skipped" in the last line). Members carry no owner, so they belong to whoever unpacks
them, and the modification time, so that unpacking an unchanged job changes nothing.

With --report it first summarises a job that started (a nodes/ directory), as `dglkit report` does, so that
train.yml collects a job in one command on the storage host.
"""

import argparse
import base64
import os
import re
import stat
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO

from dglkit import report
from dglkit.common import UserError, emit_result, file_kind, open_regular

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, type=Path, help="the job directory to pack")
    parser.add_argument("--out", type=Path, help="the archive to write (replaced); default: a new temporary file, "
                        "named in the result's \"archive\", or, up to --inline-mb, no file: the archive in the "
                        "result's \"archive_base64\"")
    parser.add_argument("--inline-mb", type=float, default=32,
                        help="without --out, an archive up to this size goes in the result instead of a file "
                        "(train.yml then reads it from the command's output: no file to fetch and remove, two "
                        "round trips fewer; a larger one is fetched, not held in the controller's memory several "
                        "times over) (%(default)s)")
    parser.add_argument("--match", default=".*",
                        help="regular expression that a file's path relative to the job directory must match whole")
    parser.add_argument("--report", action="store_true",
                        help="summarise a job that started first (dglkit report); its error goes to the result's "
                        "\"report_error\"")


class Exactly:
    """A file's first `size` bytes, padded with NULs when it shrank since fstat() (a log cut while packing):
    the archive stays well-formed, whatever the job does meanwhile."""

    def __init__(self, f: BinaryIO, size: int):
        self.f, self.left, self.short = f, size, False

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            self.short = True
            data += b"\0" * (n - len(data))
        self.left -= n
        return data


def walk(fd: int, prefix: str = ""):
    """(relative path, stat without following links, directory descriptor, name) of every entry below fd,
    depth first in name order; directories are entered by descriptor, never through a link."""
    for name in sorted(os.listdir(fd)):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone since the listing
        yield prefix + name, st, fd, name
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, DIRECTORY, dir_fd=fd)
            except OSError:
                continue  # replaced by something else since the stat: reported as what it is now, if matched
            try:
                yield from walk(sub, prefix + name + "/")
            finally:
                os.close(sub)


def pack(job_dir: Path, out: Path, match: str) -> tuple[int, list[str]]:
    """Write the archive; returns the number of files in it and the entries left out, with what each was."""
    wanted = re.compile(match)
    packed, skipped = 0, []
    root = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
            for path, st, fd, name in walk(root):
                if stat.S_ISDIR(st.st_mode) or not wanted.fullmatch(path):
                    continue
                if not stat.S_ISREG(st.st_mode):
                    skipped.append(f"{path} ({file_kind(st)})")
                    continue
                try:
                    entry = os.fdopen(open_regular(name, dir_fd=fd), "rb")
                except OSError as error:
                    skipped.append(f"{path} (replaced while packing: {error.strerror})")
                    continue
                with entry:
                    st = os.fstat(entry.fileno())
                    if st.st_nlink > 1:
                        skipped.append(f"{path} (a hard link: {st.st_nlink} names)")
                        continue
                    info = tarfile.TarInfo(path)
                    info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode) & 0o755
                    data = Exactly(entry, st.st_size)
                    tar.addfile(info, data)
                    if data.short:
                        skipped.append(f"{path} (shrank while packing: its end is missing)")
                    packed += 1
    finally:
        os.close(root)
    return packed, skipped


def summarise(job_dir: Path) -> dict:
    """`dglkit report` on a job that started: {"changed", "report_error"} (None: no error)."""
    if not os.path.isdir(job_dir / "nodes") or os.path.islink(job_dir / "nodes"):
        return {"changed": False, "report_error": None, "reported": False}
    try:
        changed = report.write_summary(job_dir)["changed"]
    except UserError as error:
        return {"changed": False, "report_error": str(error), "reported": True}
    except (KeyError, TypeError, ValueError) as error:  # a program's metrics.jsonl in a format of its own
        return {"changed": False, "report_error": f"{type(error).__name__}: {error}", "reported": True}
    return {"changed": changed, "report_error": None, "reported": True}


def collect(job_dir: Path, match: str, report: bool, out: Path | None = None, inline_mb: float = 32) -> dict:
    """What `dglkit pack` answers (`dglkit watch --pack` too, at a job's end)."""
    summary = summarise(job_dir) if report else {"changed": False}
    archive = out
    if archive is None:
        fd, name = tempfile.mkstemp(prefix="dglkit-pack-", suffix=".tar")
        os.close(fd)
        archive = Path(name)
    packed, skipped = pack(job_dir, archive, match)
    where: dict[str, str] = {"archive": str(archive)}
    if out is None and archive.stat().st_size <= inline_mb * 2**20:
        where = {"archive_base64": base64.b64encode(archive.read_bytes()).decode()}
        archive.unlink()
    for entry in skipped:
        print(f"dglkit pack: warning: left out {entry}", file=sys.stderr)
    return {**summary, **where, "files": packed, "skipped": skipped}


def run(args: argparse.Namespace) -> int:
    emit_result(collect(args.job_dir, args.match, args.report, args.out, args.inline_mb))
    return 0


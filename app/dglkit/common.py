"""Small helpers shared by the commands."""

import errno
import hashlib
import json
import os
import resource
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dglkit.printable import scrub

if TYPE_CHECKING:
    import numpy as np

# The job directory's checkpoint (dglkit/checkpoint.py writes it); named here for the commands that must not
# import torch to look at it: jobdir, watch, blame.
CHECKPOINT = "checkpoint.pt"
CHECKPOINT_SPARSE = "checkpoint-sparse"


class UserError(Exception):
    """Bad input or environment, reported as one line that says what to fix (exit code 2)."""


def emit_result(result: dict[str, Any]) -> None:
    """Print the machine-readable last line that playbooks read (must contain "changed"). Its strings may hold what
    a job wrote (reasons, log tails, file names, command lines): none of them carries a control character on to
    the controller's terminal."""
    assert "changed" in result
    sys.stdout.flush()
    print(json.dumps(scrub(result), sort_keys=True), flush=True)


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its waited-for children, in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def digest(value: Any) -> str:
    """Short stable hash of a JSON-able value: equal inputs give equal fingerprints across runs."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def open_regular(path: Path | str, dir_fd: int | None = None) -> int:
    """A read-only descriptor of path when it is a regular file, else OSError.

    Job directories are writable by the job: whatever runs outside its sandbox reads them without following a
    link it planted (O_NOFOLLOW) and without blocking on a FIFO (O_NONBLOCK).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    kind = file_kind(os.fstat(fd))
    if kind != "file":
        os.close(fd)
        raise OSError(errno.EINVAL, f"{kind}, not a regular file", str(path))
    return fd


def file_kind(st: os.stat_result) -> str:
    """What a stat result is, in words ("file" for a regular file)."""
    if stat.S_ISREG(st.st_mode):
        return "file"
    kinds = {stat.S_ISLNK: "a symbolic link", stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO",
             stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    return next((name for test, name in kinds.items() if test(st.st_mode)), "a special file")


def is_regular(path: Path) -> bool:
    try:
        return file_kind(os.lstat(path)) == "file"
    except OSError:
        return False


def read_text(path: Path) -> str:
    """The text of a regular file (open_regular: no link, FIFO or hard link)."""
    with os.fdopen(open_regular(path)) as f:
        return f.read()


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in path, or None when it is missing, unreadable or not a regular file (then it gets
    rebuilt)."""
    try:
        value = json.loads(read_text(path))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def replace_file(path: Path, data: bytes) -> None:
    """Write atomically: a reader (or a re-run after a crash) never sees half a file. The data goes to a new
    temporary file and is renamed over path, which replaces whatever path is (a link is not written through)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_csv(path: Path) -> "np.ndarray":
    """Integer columns of a CSV file, with or without a header line."""
    import pandas as pd

    frame = pd.read_csv(path, header=None)
    if not all(pd.api.types.is_integer_dtype(t) for t in frame.dtypes):
        frame = pd.read_csv(path)  # the first line was a header
    if not all(pd.api.types.is_integer_dtype(t) for t in frame.dtypes):
        raise UserError(f"{path}: every column must hold integers (an optional header line aside)")
    return frame.to_numpy().squeeze(axis=1) if frame.shape[1] == 1 else frame.to_numpy()


def write_json(path: Path, value: dict[str, Any]) -> None:
    replace_file(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode())


def read_partition_config(path: Path) -> dict[str, Any]:
    """The <graph>.json that `dglkit partition` wrote, with the fields the launcher and trainer rely on."""
    if not path.is_file():
        raise UserError(f"partition config {path} not found: pass the <graph>.json written by `dglkit partition`")
    try:
        config = json.loads(path.read_text())
        config["num_parts"] = int(config["num_parts"])
        config["graph_name"]
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path} is not a DGL partition config ({error!r}): re-run `dglkit partition`") from None
    return config


def check_machine_count(part_config: Path, num_parts: int, ip_config: Path, num_machines: int) -> None:
    """DGL needs one partition per ip_config line; with fewer or more, servers and trainers wait forever."""
    if num_parts != num_machines:
        raise UserError(f"{part_config} has {num_parts} partitions but {ip_config} lists {num_machines} "
                        "machines: partition the graph for as many machines as ip_config has lines")


def shared_fs_now(directory: Path) -> float:
    """The current time by the clock that stamps files in `directory` (the file server's, on NFS).

    Comparing a file's mtime with this, not with time.time(), judges its age on one clock: a host whose clock
    is minutes off does not make a fresh file look old.
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=".clock.", dir=directory)
    except OSError:
        return time.time()  # not writable here (a read-only look): the local clock is the best there is
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        os.unlink(probe)


class Heartbeat:
    """A program's sign of life for `dglkit launch`: a counter in $DGLKIT_HEARTBEAT_DIR/heartbeat-<RANK>.

    The launcher notes, by its own clock, when the counter last changed; a counter that stops for the stall
    timeout stops the job. Programs that never beat are never judged stalled. Cheap to call often: it writes
    at most once a second.
    """

    def __init__(self) -> None:
        directory = os.environ.get("DGLKIT_HEARTBEAT_DIR")
        self.path = Path(directory) / f"heartbeat-{os.environ.get('RANK', '0')}" if directory else None
        self.count, self.written = 0, 0.0

    def __call__(self) -> None:
        if self.path is None or time.monotonic() - self.written < 1.0:
            return
        self.count += 1
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{self.count}\n")
        os.replace(tmp, self.path)
        self.written = time.monotonic()


beat = Heartbeat()

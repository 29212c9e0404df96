"""A long command's progress file, which a playbook shows a line of at each poll (`dglkit follow`, and the mpi
builder's ranks through dglkit.mpicomm).

A command names its phases (PROGRESS.phase) and counts its steps within one (PROGRESS.step); the record
{"command", "host", "pid", "started", "phase", "done", "total", "unit", "peak_rss_mb", "time"} replaces the file
at each new phase and at most every PROGRESS_SECONDS within one (read back with dglkit.common.read_json).
Without a file (DGLKIT_PROGRESS unset: a command run by hand) nothing is written.
"""

import os
import time
from pathlib import Path
from typing import Any

from dglkit.common import peak_rss_mb, write_json

# The file a command replaces with its progress (`dglkit follow` sets it for the command it runs).
PROGRESS_ENV = "DGLKIT_PROGRESS"
PROGRESS_SECONDS = 2.0


class Progress:
    def __init__(self) -> None:
        self.path: Path | None = None
        self.record: dict[str, Any] = {}
        self.written = 0.0
        self.child: int | None = None

    def begin(self, command: str) -> None:
        """A command starts: the file of $DGLKIT_PROGRESS, if set, names it from now on."""
        path = os.environ.get(PROGRESS_ENV)
        self.open(Path(path) if path else None, {"command": command, "pid": os.getpid(), "started": time.time()})

    def open(self, path: Path | None, record: dict[str, Any]) -> None:
        self.path, self.record = path, {**record, "host": os.uname().nodename}
        self.phase("start")

    def phase(self, name: str, total: int = 0, unit: str = "") -> None:
        self.record.update(phase=name, done=0, total=total, unit=unit)
        self.write()

    def step(self, done: int, total: int | None = None) -> None:
        self.record.update(done=done, total=self.record.get("total", 0) if total is None else total)
        if time.monotonic() - self.written >= PROGRESS_SECONDS or done == self.record["total"]:
            self.write()

    def watch_child(self, pid: int) -> None:
        """The record's peak memory counts a running child's too: a command that runs another (dglkit pip) is
        not the one that uses the memory, and a child's peak shows in our own only once it is waited for."""
        self.child = pid

    def write(self) -> None:
        if self.path is not None:
            peak = max(peak_rss_mb(), child_peak_mb(self.child))
            write_json(self.path, {**self.record, "peak_rss_mb": round(peak), "time": time.time()})
            self.written = time.monotonic()


def child_peak_mb(pid: int | None) -> float:
    """A running process's peak resident memory (VmHWM) in MiB; 0 when there is none or it is gone."""
    if pid is None:
        return 0.0
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    found = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(found[0]) / 1024 if found else 0.0


PROGRESS = Progress()


def line(record: dict[str, Any] | None, now: float) -> str:
    """One line for people: `prepare: save graph, 3/8 parts, 42 s, peak 950 MB`."""
    if not record:
        return "starting"
    what = f"{record.get('command', '?')}: {record.get('phase', '?')}"
    if record.get("total"):
        what += f", {record.get('done', 0)}/{record['total']}" + (f" {record['unit']}" if record.get("unit") else "")
    seconds = now - float(record.get("started", now))
    return f"{what}, {seconds:.0f} s, peak {record.get('peak_rss_mb', 0)} MB"

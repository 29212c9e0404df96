"""This node's launcher state during a job: its processes, its state as status.json tells it, its launcher.log,
and its failure of an attempt (failed.json, and the job's FAILED file when it is first)."""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from dglkit.blame import failed_file, progress
from dglkit.common import write_json
from dglkit.launcher.failure import abort_message, log_tail, newer_dgl_hint, publish_failed

STATUS_EVERY = 2.0
# How often the launcher looks at its processes, the job directory and the other nodes.
POLL = 0.5


def current_attempt(job_dir: Path) -> int:
    """1 + the last attempt that failed and was archived (attempts/<n>/FAILED)."""
    archived = [int(path.parent.name) for path in job_dir.glob("attempts/*/FAILED") if path.parent.name.isdigit()]
    return max(archived, default=0) + 1


class Node:
    """This node's processes, its state and its records of them."""

    def __init__(self, cfg: argparse.Namespace, job: dict):
        self.cfg, self.job = cfg, job
        self.job_dir: Path = job["job_dir"]
        self.node_dir: Path = job["node_dir"]
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.pgids: set[int] = set()
        self.state, self.reason = "starting", ""
        self.status_written = 0.0
        self.signal_received = 0
        self.shm_before = set(os.listdir("/dev/shm"))
        self.log_file: TextIO | None = None
        self.nodes: list[str] = cfg.nodes or [cfg.node_name]
        self.attempt = current_attempt(self.job_dir)
        self.peers_checked = 0.0
        self.attempt_started = time.monotonic()
        self.servers_started = time.time()
        # Whether the current attempt started its processes (one that waited for a node in vain did not).
        self.started = True
        self.listening = False
        self.victim_seen = 0.0

    def say(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} launch[{self.cfg.node_name}]: {message}"
        print(line, file=sys.stderr, flush=True)
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def set_state(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        self.write_status(force=True)

    def write_status(self, force: bool = False, last: bool = False) -> None:
        # The end of a job that succeeded is written last (run()), after the launcher's own last lines: a watcher
        # that sees it (and packs the job's files at once) finds every log complete.
        if (self.state == "succeeded" and not last) or (not force and time.time() - self.status_written < STATUS_EVERY):
            return
        processes = [{"name": name, "pid": proc.pid, "returncode": proc.poll()} for name, proc in self.procs.items()]
        write_json(self.node_dir / "status.json", {"node": self.cfg.node_name, "state": self.state,
                                                   "reason": self.reason, "updated": time.time(),
                                                   "attempt": self.attempt, "processes": processes,
                                                   "listening": self.listening})
        self.status_written = time.time()

    def failed_record(self) -> dict | None:
        """The job's FAILED file when it is about this attempt."""
        failed = failed_file(self.job_dir)  # typed as watch reads it: a field of the wrong type counts as absent
        return failed if failed is not None and failed.get("attempt", 1) == self.attempt else None

    def fail(self, process: str, code: int | None, reason: str, log: Path, node: str | None = None,
             tail: list[str] | None = None, where: str | None = None) -> None:
        """Record the failure in this node's failed.json and, if no other node was first, in the job's FAILED
        file (which stops every node)."""
        tail = log_tail(log) if tail is None else tail
        aborted = abort_message(log) if code == -signal.SIGABRT else ""
        reason += f" ({aborted})" if aborted else ""
        reason += newer_dgl_hint(tail)
        self.say(f"FAILED: {process}: {reason}; last lines of {log}:\n    " + "\n    ".join(tail))
        record = {"node": node or self.cfg.node_name, "process": process, "exit_code": code, "reason": reason,
                  "where": where, "log": str(log), "log_tail": tail, "time": time.time(), "attempt": self.attempt,
                  "started": self.started, "progress": progress(self.job_dir)}
        write_json(self.node_dir / "failed.json", record)
        publish_failed(self.job_dir, record, self.cfg.node_name)
        # After FAILED: a watcher that sees this node failed also sees whether restarts are left.
        self.set_state("failed", f"{process}: {reason}")

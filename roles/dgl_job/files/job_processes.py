#!/usr/bin/env python3
"""The processes of a job that are alive on this host, for the leftover check after a stop.

Usage: job_processes.py JOB_DIR
Prints one JSON list with a line per process, by pid: "<pid> (<user>, <unit>: <command>)". A process of the
job is the launcher (its command line names <job dir>/job.json) or anything that carries
DGLKIT_OUTPUT_DIR=<job dir> in its environment: every process the launcher starts does, and so do their
children, wherever they run (in the job unit, or outside it when a process escaped the unit's stop).
"""

import json
import os
import pwd
import sys
from pathlib import Path


def read(pid: str, name: str) -> list[str]:
    """A NUL-separated /proc file as a list; [] for a process that is gone or a kernel thread."""
    try:
        return (Path("/proc") / pid / name).read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def unit(pid: str) -> str:
    """The systemd unit (or scope) the process belongs to, from its cgroup path (systemd's own hierarchy on a
    cgroup v1 host, the unified one otherwise)."""
    paths = dict(line.split(":", 2)[1:] for line in (Path("/proc") / pid / "cgroup").read_text().splitlines())
    path = paths.get("name=systemd", paths.get("", ""))
    return path.rstrip("/").rpartition("/")[2] or "no unit"


def owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def main() -> None:
    job_dir = os.path.realpath(sys.argv[1])
    found = []
    for pid in sorted(filter(str.isdigit, os.listdir("/proc")), key=int):
        command = [word for word in read(pid, "cmdline") if word]
        if f"DGLKIT_OUTPUT_DIR={job_dir}" not in read(pid, "environ") and f"{job_dir}/job.json" not in command:
            continue
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            found.append(f"{pid} ({owner(uid)}, {unit(pid)}: {' '.join(command)[:160]})")
        except OSError:
            continue  # gone since
    print(json.dumps(found))


if __name__ == "__main__":
    main()

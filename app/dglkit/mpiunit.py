"""The mpi partition's unit (dglkit-partition.service, started by roles/dgl_dataset/tasks/mpi.yml on the first
worker) as status.yml and stop.yml see it: `dglkit control unit` describes it beside the job unit, `dglkit control
stop` stops it and names the ranks it left on any worker.

What the unit partitions (the partition directory and the hosts, one rank each) comes from its own command line
(`systemctl show -p ExecStart`), which root wrote: never from a file the job account can change."""

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from dglkit.mpicomm import PROGRESS_ENV
from dglkit.mpijob import RUNNING, UNIT


def from_command(exec_start: str) -> dict[str, Any]:
    """--out and --hosts of `dglkit mpi run` in the unit's ExecStart ("{ path=… ; argv[]=… ; … }")."""
    argv = exec_start.partition("argv[]=")[2].partition(" ; ")[0].split()
    values = dict(zip(argv, argv[1:]))
    pairs = [item.partition("=") for item in values.get("--hosts", "").split(",") if item]
    return {"out": values.get("--out", ""), "hosts": {name: address for name, _, address in pairs if name and address}}


def describe(props: dict[str, str], node: str = "") -> dict[str, Any]:
    """{"running", "state", "out", "hosts", "line"} of the unit's `systemctl show` properties."""
    state = props.get("ActiveState", "inactive")
    running = state in RUNNING
    where = f"{node}: " if node else ""
    return {"running": running, "state": state, **(from_command(props.get("ExecStart", "")) if running else
                                                   {"out": "", "hosts": {}}),
            "line": f"{where}partition (mpi) {state}" if running else ""}


def show(node: str = "") -> dict[str, Any]:
    proc = subprocess.run(["systemctl", "show", UNIT, "-p", "ActiveState,ExecStart"], capture_output=True,
                          text=True, check=False)
    props = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return describe(props, node)


def stop_unit() -> None:
    """systemctl stop: mpirun gets SIGTERM and takes its daemons, and their ranks on every worker, with it. The unit
    is transient (--collect): stopped, it is gone, and a later train.yml starts the partition afresh."""
    proc = subprocess.run(["systemctl", "stop", UNIT], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 5):  # 5: gone since the look
        raise RuntimeError(f"systemctl stop {UNIT}: {proc.stderr.strip()}")


def rank_processes(wait: float) -> list[str]:
    """This host's ranks of an mpi partition (their environment carries the progress directory mpirun exported),
    "<pid>: <command>", after up to wait seconds for them to go: a rank on another worker ends when its daemon
    loses mpirun's connection, a moment after the unit stops."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # gone, or a kernel thread
            if any(variable.startswith(f"{PROGRESS_ENV}=".encode()) for variable in environ):
                found.append(f"{pid}: {command.strip()[:160]}")
        if not found or time.monotonic() >= deadline:
            return sorted(found)
        time.sleep(0.2)

"""The mpi partition's unit (dglkit-partition.service, started by roles/dgl_dataset/tasks/mpi.yml on the first
worker) as status.yml and stop.yml see it: `dglkit control unit` describes it beside the job unit, `dglkit control
stop` stops it and names the ranks it left on any worker.

What the unit partitions (the partition directory and the hosts, one rank each) comes from its own command line
(`systemctl show -p ExecStart`), which root wrote: never from a file the job account can change."""

import os
import subprocess
import time
from typing import Any

from dglkit.mpicomm import PROGRESS_ENV
from dglkit.mpijob import RUNNING, UNIT, host_list
from dglkit.systemd import exec_argv, parse_show, read_proc


def from_command(exec_start: str) -> dict[str, Any]:
    """--out and --hosts of `dglkit mpi run` in the unit's ExecStart (root wrote them: `dglkit mpi run` parsed them)."""
    argv = exec_argv(exec_start)
    values = dict(zip(argv, argv[1:]))
    return {"out": values.get("--out", ""), "hosts": host_list(values["--hosts"]) if "--hosts" in values else {}}


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
    return describe(parse_show(proc.stdout), node)


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
            if any(variable.startswith(f"{PROGRESS_ENV}=") for variable in read_proc(pid, "environ")):
                found.append(f"{pid}: {' '.join(read_proc(pid, 'cmdline')).strip()[:160]}")
        if not found or time.monotonic() >= deadline:
            return sorted(found)
        time.sleep(0.2)

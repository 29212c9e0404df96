"""Helpers for end-to-end job tests, shared by the test modules (a module of its own: `from conftest import`
would find another tier's conftest when all tiers run together)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Cluster, PlaybookRun

# The jobs cluster's (conftest.py's jobs_cluster): each host's own directory, which holds its venv
# (dglkit_python_env_location: per_node), and the DGL server port, other than the default.
JOBS_NODE_DIR = "/opt/dglkit"
JOBS_VENV = f"{JOBS_NODE_DIR}/venv"
JOBS_SERVER_PORT = 30150


def as_job_user(command: str) -> str:
    """A shell command as the job account (the default dglkit_user)."""
    return f"runuser -u dglkit -- sh -c '{command}'"


def mesh_ssh(target: str) -> str:
    """The job account's ssh to target with the kit's settings alone (its own known_hosts unused)."""
    return as_job_user(f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/dev/null {target} hostname")


def flat(output: str) -> str:
    """Output with the YAML callback's line wrapping undone."""
    return " ".join(output.split())


def run_folder(output: str) -> Path:
    """The run folder train.yml printed at the end."""
    found = re.search(r"run folder: (/[^\s']+)", flat(output))
    assert found, output[-3000:]
    return Path(found.group(1))


def workers(cluster: Cluster) -> list[str]:
    return list(cluster.workers())


def ip_config_of_workers(cluster: Cluster) -> list[str]:
    """ip_config.txt on the jobs cluster as site.yml must render it: the workers' cluster addresses, in inventory order."""
    addresses = cluster.cluster_addresses()
    return [f"{addresses[host]} {JOBS_SERVER_PORT}" for host in workers(cluster)]


def working_set(cluster: Cluster, host: str) -> int:
    """The host's memory in use as its memory cgroup counts it, less the inactive file cache."""
    stat = dict(line.split() for line in cluster.ssh(host, "cat /sys/fs/cgroup/memory/memory.stat").stdout.splitlines())
    usage = int(cluster.ssh(host, "cat /sys/fs/cgroup/memory/memory.usage_in_bytes").stdout)
    return usage - int(stat["total_inactive_file"])


def assert_clean(cluster: Cluster) -> None:
    for host in cluster.hosts():
        assert cluster.leftovers(host) == {}, host


def train(cluster: Cluster, runs: Path, *args: str, check: bool = True) -> PlaybookRun:
    return cluster.playbook("playbooks/train.yml", "-e", f"dgl_job_run_dir={runs}", *args, check=check)


# train.yml runs the current test started in the background (start_train), each in a session of its own.
BACKGROUND: list[subprocess.Popen] = []


def start_train(cluster: Cluster, runs: Path, *args: str) -> subprocess.Popen:
    proc = cluster.start_playbook("playbooks/train.yml", "-e", f"dgl_job_run_dir={runs}", *args)
    BACKGROUND.append(proc)
    return proc


def kill(proc: subprocess.Popen) -> str:
    """SIGKILL a background train.yml and the workers it forked (they hold its output pipe open); its output."""
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()[0]


def stop_background(cluster: Cluster) -> None:
    """After each test (a module's autouse fixture): a test that failed while its train.yml ran must not leave
    that playbook, or the job it started on the hosts, to the next test."""
    left = [proc for proc in BACKGROUND if proc.poll() is None]
    for proc in left:
        kill(proc)
    BACKGROUND.clear()
    if left or any("unit" in cluster.leftovers(host) for host in workers(cluster)):
        cluster.playbook("playbooks/stop.yml", check=False)

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

# One host-side look for what a job left (conftest's Cluster.leftovers): processes, listening DGL/rendezvous
# ports, /dev/shm files, the job unit.
LEFTOVERS = r"""
import json, os, subprocess
procs = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        cmd = open('/proc/%s/cmdline' % pid, 'rb').read().replace(b'\0', b' ').decode()
    except OSError:
        continue
    if 'dglkit' in cmd and pid != str(os.getpid()):
        procs.append(cmd[:120])
ports = set()
for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == '0A':
            ports.add(int(fields[1].rsplit(':', 1)[1], 16))
unit = subprocess.run(['systemctl', 'is-active', 'dglkit-job'], capture_output=True, text=True).stdout.strip()
# The rendezvous and DGL's servers (any dglkit_server_port a test sets).
dgl = [port for port in ports if port == 29500 or 30000 <= port < 32000]
print(json.dumps({'procs': procs, 'ports': sorted(dgl), 'shm': os.listdir('/dev/shm'), 'unit': unit}))
"""
CLEAN = {"procs": [], "ports": [], "shm": [], "unit": "inactive"}


def as_job_user(command: str) -> str:
    """A shell command as the job account (the default dglkit_user)."""
    return f"runuser -u dglkit -- sh -c '{command}'"


def mesh_ssh(target: str) -> str:
    """The job account's ssh to target with the kit's settings alone (its own known_hosts unused)."""
    return as_job_user(f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/dev/null {target} hostname")


def flat(output: str) -> str:
    """Output with the YAML callback's line wrapping undone."""
    return " ".join(output.split())


def with_names(cmd: list[str], etc_hosts: Path | None) -> list[str]:
    """cmd in a mount namespace of its own that sees etc_hosts as /etc/hosts (inventories can then name cluster
    addresses without touching this machine's /etc/hosts); cmd itself without etc_hosts."""
    if etc_hosts is None:
        return cmd
    return ["unshare", "--mount", "sh", "-ec", 'mount --bind "$0" /etc/hosts; exec "$@"', str(etc_hosts), *cmd]


def run_folder(output: str) -> Path:
    """The run folder train.yml printed at the end."""
    found = re.search(r"run folder: (/[^\s']+)", flat(output))
    assert found, output[-3000:]
    return Path(found.group(1))


def workers(cluster: Cluster) -> list[str]:
    return list(cluster.groups()["workers"])


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

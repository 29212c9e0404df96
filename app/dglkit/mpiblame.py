"""What `dglkit mpi` reads about its MPI run: the network Open MPI's TCP is bound to, the ranks' progress files
(dglkit.mpicomm.Progress) and, when mpirun failed, the host to name.

Rank r runs on the r-th host given (mpirun --map-by node over the hostfile in that order), and Open MPI's daemon
r is the one on that host (daemon 0 is mpirun's own), so mpirun's messages name a rank or a daemon by number;
failing those, ssh's or mpirun's messages name an address or a host name; failing those, the rank whose
progress stopped first.
"""

import ipaddress
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from dglkit.common import UserError, read_json

# Open MPI 4.1's messages, most specific first: each gives a rank or daemon number.
NUMBERED = [
    (re.compile(r"Remote daemon:\s*\[\[\d+,\d+\],(\d+)\]"), "Open MPI lost the connection to its daemon there"),
    (re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)"), "its rank was killed"),
    (re.compile(r"MPI_ABORT was invoked on rank (\d+)"), "its rank failed"),
    (re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited"), "its rank exited"),
]
# Then messages that name the host by the address or name mpirun knows it by.
NAMED = [
    (re.compile(r"Connection to ([\w.:-]+) closed"), "the SSH connection to its Open MPI daemon closed"),
    (re.compile(r"ssh: connect to host ([\w.:-]+)"), "the first worker could not reach it over SSH"),
    (re.compile(r"on node ([\w.:-]+)"), "mpirun named it"),
]
TAIL_LINES = 20


def local_network(address: str) -> str:
    """The network (CIDR) of this host's interface that holds `address`, for btl/oob_tcp_if_include."""
    found = json.loads(subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                                      check=True).stdout or "[]")
    for interface in found:
        for info in interface.get("addr_info", []):
            if info.get("local") == address:
                return str(ipaddress.ip_interface(f"{address}/{info['prefixlen']}").network)
    raise UserError(f"{address} is not an address of this host: run `dglkit mpi run` on the first host given")


def progress(directory: Path) -> dict[int, dict[str, Any]]:
    """Each rank's last progress record, by rank."""
    records = (read_json(path) for path in sorted(directory.glob("rank*.json")))
    return {record["rank"]: record for record in records if record and "rank" in record}


def describe(record: dict[str, Any] | None) -> str:
    """One rank's progress in a few words: 'send edges 3/10 812 MB'."""
    if record is None:
        return "waiting"
    rounds = f" {record['done']}/{record['total']}" if record.get("total") else ""
    return f"{record['program'].removeprefix('mpi')} {record['phase']}{rounds} {record['peak_rss_mb']} MB"


def blame(log: str, hosts: dict[str, str], progress_dir: Path) -> tuple[str | None, str]:
    """(inventory name of the host that failed the run, why), from mpirun's output, else the progress files."""
    names = list(hosts)
    for pattern, reason in NUMBERED:
        match = pattern.search(log)
        if match and int(match.group(1)) < len(names):
            return names[int(match.group(1))], reason
    records = progress(progress_dir)
    by_node = {address: name for name, address in hosts.items()} | {
        record["host"]: names[rank] for rank, record in records.items() if rank < len(names)}
    for pattern, reason in NAMED:
        for node in pattern.findall(log):
            if node in by_node:
                return by_node[node], reason
    unfinished = [(record["time"], rank) for rank, record in records.items() if record["phase"] != "done"]
    if unfinished:
        _, rank = min(unfinished)
        return names[rank], f"its rank's progress stopped first ({time.time() - min(unfinished)[0]:.0f} s ago)"
    return None, "mpirun failed before any rank reported"


def tail(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-TAIL_LINES:]

"""The watch over this node's processes during an attempt: a process that fails or leaves a failure record,
servers that do not listen, a heartbeat that stops; and the end of an attempt whose trainers all succeeded."""

import signal
import time
from pathlib import Path

import psutil

from dglkit.blame import PEER_LOST, is_victim
from dglkit.common import read_json
from dglkit.launcher.failure import abort_message, describe_exit
from dglkit.launcher.node import POLL, Node
from dglkit.launcher.outside import PEER_SETTLE, check_outside, peer_failed_first
from dglkit.launcher.stop import track_descendants

# Servers load their partition before they listen, trainers import torch and dgl before they log: on a
# large graph or a busy machine that takes minutes, whatever --stall-timeout says.
START_TIMEOUT = 600.0
LISTEN_POLL = 0.05


class HeartbeatWatch:
    """When this launcher saw each heartbeat file change, by its own monotonic clock (never the writer's)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.seen: dict[Path, tuple[str, float]] = {}

    def stalled(self, timeout: float) -> Path | None:
        now = time.monotonic()
        for path in self.directory.glob("heartbeat-*[0-9]"):
            try:
                count = path.read_text()
            except OSError:
                continue
            if self.seen.get(path, ("",))[0] != count:
                self.seen[path] = (count, now)
        return next((path for path, (_, changed) in self.seen.items() if now - changed > timeout), None)


def supervise(node: Node) -> None:
    heartbeats = HeartbeatWatch(node.node_dir)
    while node.state == "running":
        track_descendants(node)
        if check_processes(node) or check_outside(node):
            return
        if not servers_listening(node) and node.state != "running":
            return
        if all(proc.poll() == 0 for name, proc in node.procs.items() if name.startswith("trainer-")):
            wait_for_servers_exit(node)
            return
        stalled = heartbeats.stalled(node.cfg.stall_timeout)
        if stalled:
            rank = stalled.name.removeprefix("heartbeat-")
            log = node.node_dir / f"trainer-{rank}.log"
            node.fail(f"trainer-{rank}", None, f"stalled: its heartbeat did not change for "
                      f"{node.cfg.stall_timeout:.0f} s", log)
            return
        node.write_status()
        # The trainers wait for this node's servers to listen: see that soon.
        time.sleep(POLL if node.listening else LISTEN_POLL)


def safe_connections(pid: int) -> list:
    """TCP connections of a process and its descendants (a server runs under `sh -c`)."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    connections = []
    for proc in family:
        try:
            connections += proc.net_connections(kind="tcp")
        except psutil.Error:
            pass
    return connections


def servers_listening(node: Node) -> bool:
    """Whether this node's servers listen; fails the attempt for a server that ended before it listened or
    servers that did not listen within START_TIMEOUT. Checked until they do."""
    if node.listening:
        return True
    ports = {node.job["port"] + s for s in range(node.cfg.num_servers)}
    servers = {name: proc for name, proc in node.procs.items() if name.startswith("server-")}
    listening = {conn.laddr.port for proc in servers.values() if proc.poll() is None
                 for conn in safe_connections(proc.pid) if conn.status == psutil.CONN_LISTEN}
    if ports <= listening:
        node.listening = True
        node.write_status(force=True)  # the trainers connect once every node's file says so (jobsite/)
        return True
    ended = [name for name, proc in servers.items() if proc.poll() == 0]
    if ended:
        # A server that is done before it listens never ran DGL's initialize() (a command that is
        # not a DGL program, a script that returns early).
        node.fail(ended[0], 0, "exited before it listened on its port", node.logs[ended[0]])
    elif time.time() > node.servers_started + START_TIMEOUT:
        node.fail("servers", None, f"servers did not listen on ports {sorted(ports)} within "
                  f"{START_TIMEOUT:.0f} s", node.logs["server-0"])
    return False


def wait_for_servers_exit(node: Node) -> None:
    """Servers exit by themselves once every trainer of the job is done; other nodes may still finish."""
    node.say("trainers finished; waiting for the servers to exit")
    deadline = time.time() + node.cfg.stall_timeout
    while time.time() < deadline:
        if check_processes(node) or check_outside(node):
            return
        if all(proc.poll() is not None for proc in node.procs.values()):
            node.set_state("succeeded")
            return
        node.write_status()
        time.sleep(POLL)
    node.set_state("succeeded", f"servers did not exit {node.cfg.stall_timeout:.0f} s after the trainers "
                   "finished; stopped them")


def check_processes(node: Node) -> bool:
    """A local process that failed: fail the job. Of several, one killed by a signal: the trainers that lost it
    as a peer exit with an error of their own, sometimes first."""
    if check_failure_records(node):
        return True
    failed = [(name, code) for name, code in ((name, proc.poll()) for name, proc in node.procs.items())
              if code not in (None, 0)]
    if not failed:
        return False
    # Killed from outside first, then aborted, then exited with an error.
    name, code = min(failed, key=lambda failure: (failure[1] > 0, failure[1] == -signal.SIGABRT))
    if name.startswith("trainer-") and lost_a_peer(node, name, code) and peer_failed_first(node):
        return True
    node.fail(name, code, f"exited with {describe_exit(code)}", node.logs[name])
    return True


def lost_a_peer(node: Node, name: str, code: int) -> bool:
    """A trainer that exited with an error, or aborted on one about a lost connection (DGL's RPC aborts when a
    server goes), may have failed only because a process of another node did."""
    return code > 0 or (code == -signal.SIGABRT and bool(PEER_LOST.search(abort_message(node.logs[name]))))


def check_failure_records(node: Node) -> bool:
    """A process of this node that left a failure record (an uncaught exception, jobsite/sitecustomize.py) fails
    the attempt at once, naming it with its traceback, even when its parent would wait for it (a sampler)."""
    found = [record for record in map(read_json, node.node_dir.glob("failure-*.json")) if record and "process" in record]
    # A process that only lost a peer raises too, often first: the cause may be a process of this node that
    # was killed (its exit shows within a poll) or another node's, so a victim's record
    # counts only once PEER_SETTLE seconds have passed without either.
    for record in sorted(found, key=lambda record: (is_victim(record), record.get("time", 0))):
        if is_victim(record):
            node.victim_seen = node.victim_seen or time.monotonic()
            if time.monotonic() - node.victim_seen < PEER_SETTLE:
                return False
        name = record["process"]
        rank = name.removeprefix("trainer-").removesuffix("-sampler")
        log = node.logs.get(name, node.node_dir / f"trainer-{rank}.log")
        node.fail(name, None, record.get("error", ""), log,
                  tail=record.get("traceback", [])[-12:], where=record.get("where"))
        return True
    return False

"""What stops this node's attempt from outside it: a stop request (STOP, or a signal), another node's FAILED file
and another node gone silent (its status.json older than --stale-after by the shared filesystem's clock)."""

import signal
import time

from dglkit.common import read_json, shared_fs_now
from dglkit.launcher.node import POLL, STATUS_EVERY, Node

# A trainer that exits with an error, or leaves a failure record saying it lost a peer, may only have lost a peer
# that died first, here or on another node; that process's exit shows within a poll, another node's FAILED file
# within that node's poll and the shared filesystem's delay.
PEER_SETTLE = 3.0


def peer_failed_first(node: Node) -> bool:
    """Another node's failure of this attempt, or a stop request, seen within PEER_SETTLE seconds (this node then
    stops as for any other node's failure, or as stopped, and leaves the record to it): stop.yml writes STOP before
    it stops the units, so a trainer may lose its peer on another node before this node's unit is stopped."""
    deadline = time.monotonic() + (PEER_SETTLE if len(node.nodes) > 1 else 0)
    while time.monotonic() < deadline:
        if node.failed_record() is not None or (node.job_dir / "STOP").exists():
            return check_outside(node)
        time.sleep(POLL)
    return False


def check_outside(node: Node) -> bool:
    """A stop request (STOP file, or a signal), another node's FAILED file or another node gone silent."""
    if (node.job_dir / "STOP").exists():
        node.set_state("stopped", "stop requested (STOP)")
        return True
    if node.signal_received and node.cfg.max_restarts == 0:
        node.set_state("stopped", f"received {signal.Signals(node.signal_received).name}")
        return True
    if node.signal_received:
        # systemd stops the unit this way when the host shuts down: the other nodes restart without us,
        # and this node rejoins when it is back.
        node.fail("launcher", None, f"received {signal.Signals(node.signal_received).name} without a stop "
                  "request (host shutting down?)", node.node_dir / "launcher.log")
        return True
    failed = node.failed_record()
    if failed is not None:
        node.set_state("failed", f"node {failed.get('node')} failed ({failed.get('process')}: "
                       f"{failed.get('reason')}); stopped this node's processes")
        return True
    stale = stale_peer(node)
    if stale:
        node.fail("node", None, stale[1], node.node_dir / "launcher.log", node=stale[0])
        return True
    return False


def stale_peer(node: Node) -> tuple[str, str] | None:
    """Another node whose status.json is older than --stale-after by the shared filesystem's clock."""
    if len(node.nodes) < 2 or time.monotonic() - node.peers_checked < STATUS_EVERY:
        return None
    node.peers_checked = time.monotonic()
    now = shared_fs_now(node.job_dir)
    for name in node.nodes:
        if name == node.cfg.node_name:
            continue
        path = node.job_dir / "nodes" / name / "status.json"
        if (read_json(path) or {}).get("state") == "succeeded":
            continue  # done and gone: its launcher no longer refreshes the file
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            age = time.monotonic() - node.attempt_started
        if age > node.cfg.stale_after:
            return name, f"node {name} silent: its status.json is {age:.0f} s old (launcher or host down?)"
    return None

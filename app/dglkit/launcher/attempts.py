"""Attempts and restarts. After a failed attempt every launcher stops its processes, says so in
attempts/<n>/stopped/<node>, waits until every node has (or --restart-wait passes: a node that did not come back
fails the next attempt), moves its logs to attempts/<n>/nodes/<node>/ and starts attempt n+1, which resumes from
the job's checkpoint. The launchers agree through the shared job directory alone; no controller takes part."""

import os
import shutil
import time

from dglkit.blame import restart_refused
from dglkit.common import read_json
from dglkit.launcher.node import POLL, Node
from dglkit.launcher.start import start_all
from dglkit.launcher.stop import stop_all
from dglkit.launcher.supervise import supervise


def run_attempts(node: Node) -> None:
    """Attempts until one succeeds, a stop is requested, this host shuts down or the restarts run out."""
    status = read_json(node.node_dir / "status.json") or {}
    if status.get("state") == "succeeded":
        node.state = "succeeded"  # started again after the end (by hand, or at boot): nothing to do
        return
    if rejoined_after_crash(node):
        node.fail("launcher", None, f"this node's launcher started again during attempt {node.attempt} "
                  "(host rebooted or launcher killed)", node.node_dir / "launcher.log")
    while True:
        if node.failed_record() is None:
            run_attempt(node)
            if node.state in ("succeeded", "stopped") or node.signal_received:
                return
        if not may_restart(node):
            return
        missing = wait_for_peers(node)
        if node.state == "stopped":
            return
        archive_attempt(node)
        node.attempt += 1
        node.started = False
        if missing:
            node.fail("node", None, f"node(s) {', '.join(missing)} did not come back within "
                      f"{node.cfg.restart_wait:.0f} s", node.node_dir / "launcher.log", node=missing[0])


def may_restart(node: Node) -> bool:
    """Whether the failed attempt is followed by another (blame.restart_refused says when it is not)."""
    failed = node.failed_record() or {}
    reason = f"node {failed.get('node')}: {failed.get('process')}: {failed.get('reason')}"
    refused = restart_refused(node.job_dir, failed, node.cfg.max_restarts)
    if refused is None:
        node.set_state("restarting", f"attempt {node.attempt} failed ({reason})")
    elif node.cfg.max_restarts == 0:
        node.set_state("failed", reason)
    else:
        node.set_state("failed", f"attempt {node.attempt} failed ({reason}); {refused}: not restarting")
    return refused is None


def run_attempt(node: Node) -> None:
    node.procs, node.logs, node.pgids = {}, {}, set()
    node.started, node.victim_seen, node.listening, node.servers_started = True, 0.0, False, time.time()
    node.attempt_started = time.monotonic()
    node.set_state("starting")
    node.say(f"attempt {node.attempt} of at most {node.cfg.max_restarts + 1}")
    try:
        start_all(node)
        supervise(node)
    finally:
        stop_all(node)


def rejoined_after_crash(node: Node) -> bool:
    """This node's status says it was in the middle of the current attempt: its launcher died with it."""
    status = read_json(node.node_dir / "status.json") or {}
    return (status.get("attempt") == node.attempt and status.get("state") in ("starting", "running")
            and node.failed_record() is None)


def wait_for_peers(node: Node) -> list[str]:
    """Barrier before the next attempt: every node has stopped its processes. Returns the nodes that did not
    say so within --restart-wait (down, or not back yet)."""
    attempt_dir = node.job_dir / "attempts" / str(node.attempt)
    stopped = attempt_dir / "stopped"
    stopped.mkdir(parents=True, exist_ok=True)
    (stopped / node.cfg.node_name).touch()
    deadline = time.monotonic() + node.cfg.restart_wait
    while True:
        missing = sorted(set(node.nodes) - {path.name for path in stopped.iterdir()})
        # attempts/<n>/FAILED: a faster node passed the barrier already and moved the FAILED file there.
        if not missing or (attempt_dir / "FAILED").exists():
            return []
        if (node.job_dir / "STOP").exists() or node.signal_received:
            node.set_state("stopped", "stop requested while waiting to restart")
            return []
        if time.monotonic() > deadline:
            return missing
        node.write_status()
        time.sleep(POLL)


def archive_attempt(node: Node) -> None:
    """Move this node's logs of the failed attempt, and the attempt's FAILED file, to attempts/<n>/."""
    attempt_dir = node.job_dir / "attempts" / str(node.attempt)
    archive = attempt_dir / "nodes" / node.cfg.node_name
    archive.mkdir(parents=True, exist_ok=True)
    if node.log_file:
        node.log_file.close()
    for path in node.node_dir.iterdir():
        # unit.log is systemd's for the unit's whole life; status.json always tells the current state.
        if path.name not in ("status.json", "unit.log"):
            os.replace(path, archive / path.name)
    node.log_file = open(node.node_dir / "launcher.log", "a")
    if node.failed_record() is not None:
        if (node.job_dir / "metrics.jsonl").exists():
            shutil.copy(node.job_dir / "metrics.jsonl", attempt_dir / ".metrics.jsonl.tmp")
            os.replace(attempt_dir / ".metrics.jsonl.tmp", attempt_dir / "metrics.jsonl")
        try:
            os.replace(node.job_dir / "FAILED", attempt_dir / "FAILED")
        except FileNotFoundError:
            pass  # another node moved it

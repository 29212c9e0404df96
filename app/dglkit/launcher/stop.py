"""Stopping every process group this launcher started (SIGTERM, SIGKILL after the grace period), reaping them, and
removing the /dev/shm files that killed processes left: afterwards no process, port or shared memory of the job
is left on this node."""

import os
import signal
import time
from pathlib import Path

import psutil

from dglkit.launcher.node import Node


def track_descendants(node: Node) -> None:
    """A process that went to a session of its own (a program's choice): remember its group to stop it too."""
    for child in psutil.Process().children(recursive=True):
        try:
            node.pgids.add(os.getpgid(child.pid))
        except ProcessLookupError:
            pass


def stop_all(node: Node) -> None:
    """SIGTERM every process group we started, SIGKILL after the grace period; reap; clean /dev/shm."""
    track_descendants(node)
    if alive(node):
        node.say(f"stopping process groups {sorted(node.pgids)}")
        signal_groups(node.pgids, signal.SIGTERM)
        deadline = time.time() + node.cfg.grace
        while alive(node) and time.time() < deadline:
            node.write_status()
            time.sleep(0.2)
        if alive(node):
            node.say(f"still running after {node.cfg.grace:.0f} s: SIGKILL")
            signal_groups(node.pgids, signal.SIGKILL)
            deadline = time.time() + 10
            while alive(node) and time.time() < deadline:
                time.sleep(0.2)
    removed = remove_orphaned_shm(node.shm_before)
    if removed:
        node.say(f"removed {len(removed)} /dev/shm files left by killed processes")
    node.write_status(force=True)


def alive(node: Node) -> bool:
    """Any process of ours left? Reaps our children (orphans become ours: we are a subreaper)."""
    for proc in node.procs.values():
        proc.poll()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass
    return any(group_exists(pgid) for pgid in node.pgids)


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg: only living members matter.
    return any(p.status() != psutil.STATUS_ZOMBIE for p in psutil.process_iter() if safe_pgid(p.pid) == pgid)


def safe_pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def signal_groups(pgids: set[int], sig: signal.Signals) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def remove_orphaned_shm(before: set[str]) -> list[str]:
    """Remove /dev/shm files that appeared during the job and that no live process holds open or mapped."""
    new = set(os.listdir("/dev/shm")) - before
    if not new:
        return []
    held: set[str] = set()
    for proc in psutil.process_iter():
        try:
            held.update(Path(f.path).name for f in proc.open_files() if f.path.startswith("/dev/shm/"))
            held.update(Path(m.path).name for m in proc.memory_maps(grouped=True) if m.path.startswith("/dev/shm/"))
        except psutil.Error:
            pass
    removed = []
    for name in sorted(new - held):
        try:
            os.unlink(f"/dev/shm/{name}")
            removed.append(name)
        except OSError:
            pass
    return removed

"""Report a job's state across all nodes from the shared job directory (status.json, FAILED, metrics.jsonl).

Prints one JSON line and returns as soon as the state or the progress changes, or after --wait seconds.
A node whose status.json is missing or has not been refreshed for --stale-after seconds (launcher dead, host
down) counts as failed once the wait is over.
"""

import argparse
import json
import time
from pathlib import Path

from dglkit.common import UserError, emit_result, read_json

POLL = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, help="the job directory shared by all nodes")
    parser.add_argument("--nodes", help="comma-separated node names (default: every <job dir>/nodes/* so far)")
    parser.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for a change")
    parser.add_argument("--stale-after", type=float, default=30,
                        help="a running node whose status is older than this many seconds counts as failed")


def node_states(job_dir: Path, nodes: list[str], stale_after: float) -> dict[str, dict]:
    """name -> {"state", "reason"}; "missing" and "stale" are watch's own states for silent nodes."""
    states = {}
    for node in nodes:
        status = read_json(job_dir / "nodes" / node / "status.json")
        if status is None:
            states[node] = {"state": "missing", "reason": f"no {job_dir}/nodes/{node}/status.json"}
        elif status.get("state") in ("starting", "running") and time.time() - status.get("updated", 0) > stale_after:
            age = time.time() - status.get("updated", 0)
            states[node] = {"state": "stale", "reason": f"status not updated for {age:.0f} s (launcher or host down?)"}
        else:
            states[node] = {"state": status.get("state"), "reason": status.get("reason", "")}
    return states


def latest_progress(job_dir: Path) -> dict | None:
    try:
        lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written right now
        if record.get("event") == "epoch":
            return record
    return None


def snapshot(job_dir: Path, nodes: list[str], stale_after: float, final: bool) -> dict:
    """The job's state; silent nodes fail it only when `final` (the wait is over)."""
    states = node_states(job_dir, nodes, stale_after)
    failed = read_json(job_dir / "FAILED")
    result = {"state": "running", "nodes": {name: s["state"] for name, s in states.items()},
              "progress": latest_progress(job_dir), "failed_node": None, "reason": "", "changed": False}
    bad = [name for name, s in states.items()
           if s["state"] in ("failed", "stopped") or (final and s["state"] in ("missing", "stale"))]
    if failed is not None:
        result.update(state="failed", failed_node=failed.get("node"),
                      reason=f"{failed.get('process')}: {failed.get('reason')}")
    elif bad:
        result.update(state="failed", failed_node=bad[0], reason=f"node {bad[0]}: {states[bad[0]]['reason']}")
    elif all(s["state"] == "succeeded" for s in states.values()):
        result["state"] = "succeeded"
    return result


def run(args: argparse.Namespace) -> int:
    job_dir = Path(args.job_dir)
    if not job_dir.is_dir():
        raise UserError(f"job directory {job_dir} not found")
    if args.nodes:
        nodes = [name.strip() for name in args.nodes.split(",") if name.strip()]
    else:
        nodes = sorted(path.name for path in (job_dir / "nodes").glob("*") if path.is_dir())
    if not nodes:
        raise UserError(f"no nodes: pass --nodes a,b (nothing in {job_dir}/nodes yet)")
    deadline = time.time() + args.wait
    first = snapshot(job_dir, nodes, args.stale_after, final=False)
    current = first
    while current["state"] == "running" and time.time() < deadline:
        time.sleep(min(POLL, max(deadline - time.time(), 0)))
        current = snapshot(job_dir, nodes, args.stale_after, final=False)
        if (current["state"], current["progress"]) != (first["state"], first["progress"]):
            break
    if current["state"] == "running" and time.time() >= deadline:
        current = snapshot(job_dir, nodes, args.stale_after, final=True)
    emit_result(current)
    return 0

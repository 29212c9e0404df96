"""Report a job's state across all nodes from the shared job directory (dglkit.jobstate).

Prints one JSON line and returns as soon as the state changes, or the progress (not before --progress-after
seconds), or after --wait seconds. A node whose status.json is missing, not a launcher's or older than
--stale-after seconds counts as failed once the wait is over (dglkit.jobstate says when). With --pack, a job that succeeded is
summarised and packed in the same answer.
"""

import argparse
import time
from pathlib import Path

from dglkit import pack
from dglkit.common import UserError, emit_result
from dglkit.jobstate import snapshot

# Seconds between looks at the job directory: the end of a job is seen within this (a look is a few stats).
POLL = 0.2
# Longest wait, once a job has failed or been stopped, for its other nodes to say so: a live launcher does within a
# poll of seeing FAILED or STOP, and the last line shows each node's final state, not the "running" before it.
SETTLE = 5.0
ACTIVE = ("starting", "running", "restarting")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, help="the job directory shared by all nodes")
    parser.add_argument("--nodes", help="comma-separated node names (default: every <job dir>/nodes/* so far)")
    parser.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for a change")
    parser.add_argument("--progress-after", type=float, default=0,
                        help="return on a progress change only once this many seconds have passed (a change of "
                        "state at once): fewer polls of a job whose epochs are short")
    parser.add_argument("--stale-after", type=float, default=30,
                        help="a running node whose status is older than this many seconds counts as failed")
    parser.add_argument("--pack", metavar="REGEX",
                        help="once the job has succeeded, also summarise it and pack the files whose path matches "
                        "(`dglkit pack --report --match REGEX`'s answer in \"packed\"): train.yml collects a job "
                        "that ends while it watches without another round trip")


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
    started = time.time()
    deadline = started + args.wait
    first = snapshot(job_dir, nodes, args.stale_after, final=False)
    current = first
    while current["state"] in ("running", "restarting") and time.time() < deadline:
        time.sleep(min(POLL, max(deadline - time.time(), 0)))
        current = snapshot(job_dir, nodes, args.stale_after, final=False)
        if current["state"] != first["state"] or (
                current["progress"] != first["progress"] and time.time() - started >= args.progress_after):
            break
    if current["state"] in ("running", "restarting") and time.time() >= deadline:
        current = snapshot(job_dir, nodes, args.stale_after, final=True)
    if args.wait > 0:
        current = settled(job_dir, nodes, args.stale_after, current)
    if args.pack and current["state"] == "succeeded":
        current["packed"] = pack.collect(job_dir, args.pack, report=True)
    emit_result(current)
    return 0


def settled(job_dir: Path, nodes: list[str], stale_after: float, current: dict) -> dict:
    """A failed or stopped job once every node that still ran has stopped, or SETTLE seconds have passed."""
    until = time.time() + SETTLE
    while (current["state"] in ("failed", "stopped") and any(state in ACTIVE for state in current["nodes"].values())
           and time.time() < until):
        time.sleep(POLL)
        current = snapshot(job_dir, nodes, stale_after, final=True)
    return current

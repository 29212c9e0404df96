"""Start and supervise this node's DGL servers and trainers (DGL's tools/launch.py, one node at a time).

Runs on every worker. Runs the job's command (the kit's own trainer, or a user program written for DGL's
launch.py) as `num_servers` DGL servers and `num_trainers` trainers, each with the environment that DGL's
launch.py gives it (a trainer: torchrun's, RANK, WORLD_SIZE, MASTER_ADDR and the rest), then watches them: a
process that fails, a heartbeat that stops, another node whose status went stale, a FAILED file written by
another node's launcher, or a STOP request stop everything this node started. Afterwards no process, listening
port or /dev/shm file of the job is left. Logs, one per process, go to <job dir>/nodes/<node>/:
server-<i>.log, trainer-<rank>.log (each trainer and its samplers) and launcher.log.

The trainers are this launcher's own children, not torchrun's: torchrun would only start them and watch them,
which this launcher does anyway, and it costs a torch import before the first trainer starts and seconds of
teardown after the last one ends (its exit barrier), on every job.

Restarts: after a failed attempt the launchers meet at a barrier in the job directory and start the next attempt
from the job's checkpoint (dglkit/launcher/attempts.py). The parts: dglkit/launcher/.
"""

import argparse
import ctypes
import signal
import sys

from dglkit.common import emit_result
from dglkit.launcher.attempts import run_attempts
from dglkit.launcher.node import Node
from dglkit.launcher.options import add_arguments, settings
from dglkit.launcher.preflight import job_over, preflight

__all__ = ["add_arguments", "run"]
PR_SET_CHILD_SUBREAPER = 36


def run(args: argparse.Namespace) -> int:
    cfg = settings(args)
    over = None if args.check else job_over(cfg)
    if over:
        # A host that was down when the job failed boots with the job's unit still enabled: its launcher has
        # nothing to do, and exits 0 so that the unit disables itself (ExecStopPost).
        print(f"dglkit launch: {over}: nothing to do on {cfg.node_name} (a new job directory runs it again)",
              file=sys.stderr, flush=True)
        emit_result({"changed": False, "node": cfg.node_name, "state": "failed", "reason": over})
        return 0
    job = preflight(cfg)
    if args.check:
        emit_result({"changed": False, "node": cfg.node_name, "command": job["command"], "cwd": str(job["cwd"])})
        return 0
    job["node_dir"].mkdir(parents=True, exist_ok=True)
    if cfg.local:
        job["ip_config"].write_text(f"127.0.0.1 {cfg.server_port}\n")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    node = Node(cfg, job)
    node.log_file = open(job["node_dir"] / "launcher.log", "a")

    def on_signal(signum: int, frame: object) -> None:
        node.signal_received = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node.say(f"machine {job['machine_id']} of {len(job['machines'])} ({job['address']}, {job['ifname']}); "
             f"{cfg.num_servers} servers, {cfg.num_trainers} trainers, {cfg.num_samplers} samplers each")
    run_attempts(node)
    node.say(f"{node.state}" + (f": {node.reason}" if node.reason else ""))
    emit_result({"changed": True, "node": cfg.node_name, "state": node.state, "reason": node.reason})
    node.write_status(force=True, last=True)
    if node.state == "succeeded":
        return 0
    if node.signal_received:
        return 128 + node.signal_received
    return 0 if node.state == "stopped" else 1

"""Starting this node's DGL servers and trainers, each with the environment that DGL's launch.py (and torchrun,
for a trainer) gives it, in a process group of its own that dies with the launcher."""

import ctypes
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from dglkit import nodedata
from dglkit.launcher.command import PYTHON_WORD
from dglkit.launcher.node import Node

# Its sitecustomize makes an uncaught exception end a job's process instead of hanging in DGL's exit.
JOBSITE = Path(__file__).resolve().parent.parent / "jobsite"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def trainer_environment(rank: int, local_rank: int, per_machine: int, machines: int, machine_id: int,
                        master_addr: str, master_port: int) -> dict[str, str]:
    """What torchrun (which DGL's launch.py runs trainers with) gives each trainer: torch.distributed's env://
    rendezvous (rank 0 hosts it on the master port) and the ranks that programs read."""
    world = per_machine * machines
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(per_machine), "GROUP_RANK": str(machine_id), "GROUP_WORLD_SIZE": str(machines),
            "ROLE_NAME": "default", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none"}


def common_environment(node: Node) -> dict[str, str]:
    """What every process of the job gets, servers and trainers alike."""
    cfg, job = node.cfg, node.job
    # The program directory for `python -m its.module` (a script's own directory is on sys.path anyway).
    pythonpath = os.pathsep.join(filter(None, [str(JOBSITE), str(job["program_dir"]) if cfg.program_dir else "",
                                               os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PATH=job["path"], PYTHONPATH=pythonpath, DGLBACKEND="pytorch",
                PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME=job["ifname"], DGL_DIST_MAX_TRY_TIMES=str(cfg.connect_retries),
                DGL_NUM_CLIENT=str(cfg.num_trainers * (1 + cfg.num_samplers) * len(job["machines"])),
                DGL_CONF_PATH=str(job["part_config"]), DGL_IP_CONFIG=str(job["ip_config"]),
                DGL_NUM_SERVER=str(cfg.num_servers), DGL_NUM_SAMPLER=str(cfg.num_samplers),
                DGL_GRAPH_FORMAT="csc", DGLKIT_OUTPUT_DIR=str(job["job_dir"]),
                DGLKIT_FAILURE_DIR=str(node.node_dir), DGLKIT_NODE=cfg.node_name, DGLKIT_ATTEMPT=str(node.attempt))


def server_environment(node: Node, env: dict[str, str], server: int) -> dict[str, str]:
    cfg, job = node.cfg, node.job
    server_env = dict(env, DGL_ROLE="server", DGL_SERVER_ID=str(job["machine_id"] * cfg.num_servers + server),
                      DGL_KEEP_ALIVE="0", OMP_NUM_THREADS=str(cfg.server_threads), DGLKIT_PROCESS=f"server-{server}")
    if job["served_names"]:
        server_env[nodedata.ENV] = json.dumps(job["served_names"])
    return server_env


def client_environment(node: Node, env: dict[str, str], rank: int, local_rank: int) -> dict[str, str]:
    cfg, job = node.cfg, node.job
    return dict(env, **trainer_environment(rank, local_rank, cfg.num_trainers, len(job["machines"]),
                                           job["machine_id"], job["machines"][0][0], cfg.master_port),
                DGL_DIST_MODE="distributed", DGL_ROLE="client", DGL_GROUP_ID="0", DGLKIT_PROCESS=f"trainer-{rank}",
                DGLKIT_SERVER_STATUS=",".join(str(node.node_dir.parent / name / "status.json") for name in node.nodes),
                OMP_NUM_THREADS=str(cfg.trainer_threads), DGLKIT_HEARTBEAT_DIR=str(node.node_dir))


def start(node: Node, name: str, command: str, env: dict[str, str], log: Path) -> None:
    # A plain `python ...` replaces the shell, so that it gets the death signal below itself.
    if PYTHON_WORD.match(command) and not re.search(r"[;&|<>()`$]", command):
        command = f"exec {command}"
    with open(log, "ab") as out:
        # Own process group (stopped by PGID); SIGTERM if the launcher itself dies.
        node.procs[name] = subprocess.Popen(
            ["/bin/sh", "-c", command], env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=node.job["cwd"], start_new_session=True, preexec_fn=die_with_parent)
    node.logs[name] = log
    node.pgids.add(node.procs[name].pid)
    node.say(f"started {name} (pid {node.procs[name].pid}), log {log}")


def start_all(node: Node) -> None:
    """The command as DGL servers, then as the trainers, each with launch.py's environment."""
    cfg, job = node.cfg, node.job
    env = common_environment(node)
    for s in range(cfg.num_servers):
        start(node, f"server-{s}", job["command"], server_environment(node, env, s), node.node_dir / f"server-{s}.log")
    # Trainers start with the servers, as DGL's launch.py starts them: their imports overlap the servers'
    # start-up, and they connect once every node's servers listen (jobsite/; DGL retries, 3 s apart, after).
    for local_rank in range(cfg.num_trainers):
        rank = job["machine_id"] * cfg.num_trainers + local_rank
        start(node, f"trainer-{rank}", job["command"], client_environment(node, env, rank, local_rank),
              node.node_dir / f"trainer-{rank}.log")
    node.servers_started = time.time()
    node.set_state("running")

"""Jobs on an nspawn test cluster for the bench scripts: stand the cluster up (tests/cluster/clusterclient.py,
the e2e tests' client too), partition on it, start a job with the kit's launcher or with DGL's plain launch.py
contract (docs/design.md, the node CLI's `launch`), and watch or stop its processes.

Processes are observed from this machine (Cluster.job_processes): polling them costs no SSH round trip and sees
every node at the same instant.
"""

import contextlib
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Iterator

import psutil

from benchlib import REPO

sys.path.insert(0, str(REPO))  # a script: the repository, for the test clusters' client
from tests.cluster.clusterclient import WS, Cluster, named  # noqa: E402

VENV_PYTHON = f"{WS}/venv/bin/python"
UNIT = "dglkit-bench-job"


def up(name: str, hosts: int) -> Cluster:
    """A running cluster of `hosts` workers (node1 is storage and a worker) with the kit stood up by site.yml;
    the name gets DGLKIT_CLUSTER_PREFIX in front."""
    cluster = named(name)
    cluster.up(hosts, storage_is_worker=True)
    if not (cluster.workspace / "venv" / "bin" / "python").exists() or not (cluster.workspace / "app").is_dir():
        cluster.stand_up()
    return cluster


@contextlib.contextmanager
def session(name: str, hosts: int, keep: bool) -> Iterator[Cluster]:
    """up() for the length of a with-block; down afterwards unless `keep`."""
    cluster = up(name, hosts)
    try:
        yield cluster
    finally:
        if not keep:
            cluster.down()


def partition(cluster: Cluster, nodes: int, degree: float) -> str:
    """Prepare and partition a synthetic graph on node1 (no-ops when current), DGL and GraphBolt formats in one
    directory so that every configuration trains on the same partitions; returns the partition config path."""
    num_parts = len(cluster.workers())
    data, out = f"{WS}/datasets/bench-{nodes}-{degree}", f"{WS}/partitions/bench-{nodes}-{degree}-{num_parts}"
    first = next(iter(cluster.workers()))
    cluster.ssh(first, f"{VENV_PYTHON} -m dglkit prepare --dataset synthetic --out {data} --num-nodes {nodes} "
                       f"--avg-degree {degree} --feat-dim 100 && {VENV_PYTHON} -m dglkit partition --dataset-dir {data} "
                       f"--out {out} --num-parts {num_parts} --graph-name bench --graphbolt", timeout=600)
    return f"{out}/bench.json"


def new_job_dir(cluster: Cluster, label: str) -> str:
    job = f"jobs/bench-{label}-{time.strftime('%H%M%S')}"
    for host in cluster.workers():
        (cluster.workspace / job / "nodes" / host).mkdir(parents=True)
    return f"{WS}/{job}"


def start_kit(cluster: Cluster, job_dir: str, part_config: str, settings: dict, train_args: list[str]) -> None:
    """Start `dglkit launch --config job.json` on every worker as playbooks/train.yml does (a transient unit)."""
    config = {"job_dir": job_dir, "ip_config": f"{WS}/ip_config.txt", "part_config": part_config,
              **settings, "train_args": train_args}
    local_job = cluster.workspace / job_dir.removeprefix(WS + "/")
    (local_job / "job.json").write_text(json.dumps(config, indent=1) + "\n")
    for host in cluster.workers():
        log = f"{job_dir}/nodes/{host}/unit.log"
        cluster.ssh(host, f"systemctl reset-failed {UNIT} 2>/dev/null; systemd-run --unit={UNIT} "
                          f"-p CollectMode=inactive-or-failed -p KillMode=mixed -p TimeoutStopSec=30 "
                          f"-p WorkingDirectory={job_dir} -p StandardOutput=append:{log} -p StandardError=append:{log} "
                          f"{VENV_PYTHON} -m dglkit launch --config {job_dir}/job.json --node-name {host}")


def start_plain(cluster: Cluster, job_dir: str, part_config: str, train_args: list[str], num_servers: int = 1,
                num_trainers: int = 1, num_samplers: int = 0, master_port: int = 29500) -> None:
    """DGL's tools/launch.py contract by hand: per machine, servers with the server environment and one
    torchrun for the trainers, started over SSH and left alone, as launch.py leaves them. Two additions that these
    hosts need to run at all: GLOO_SOCKET_IFNAME (the hostname maps to 127.0.1.1) and DGLBACKEND."""
    workers = cluster.workers()
    ip_config = f"{WS}/ip_config.txt"
    train = ["-m", "dglkit", "train", "--ip-config", ip_config, "--part-config", part_config, "--out-dir", job_dir,
             *train_args]
    common = {"DGLBACKEND": "pytorch", "GLOO_SOCKET_IFNAME": "eth0", "DGL_NUM_SAMPLER": num_samplers,
              "DGL_NUM_CLIENT": num_trainers * (1 + num_samplers) * len(workers), "DGL_CONF_PATH": part_config,
              "DGL_IP_CONFIG": ip_config, "DGL_NUM_SERVER": num_servers, "DGL_GRAPH_FORMAT": "csc"}
    master = next(iter(workers.values()))
    for m, host in enumerate(workers):
        node_dir = f"{job_dir}/nodes/{host}"
        for s in range(num_servers):
            env = {**common, "DGL_ROLE": "server", "OMP_NUM_THREADS": 1, "DGL_SERVER_ID": m * num_servers + s}
            background(cluster, host, env, [VENV_PYTHON, *train], f"{node_dir}/server-{s}.log")
        # launch.py's trainer default: OMP threads = max(cpus // 2 // trainers, 1); these hosts see 2 cpus.
        env = {**common, "DGL_DIST_MODE": "distributed", "DGL_ROLE": "client", "DGL_GROUP_ID": 0,
               "OMP_NUM_THREADS": max((os.cpu_count() or 1) // 2 // num_trainers, 1)}
        torchrun = [VENV_PYTHON, "-m", "torch.distributed.run", f"--nproc_per_node={num_trainers}",
                    f"--nnodes={len(workers)}", f"--node_rank={m}", f"--master_addr={master}",
                    f"--master_port={master_port}", *train]
        background(cluster, host, env, torchrun, f"{node_dir}/trainer.log")


def background(cluster: Cluster, host: str, env: dict, cmd: list[str], log: str) -> None:
    assignments = " ".join(f"{key}={shlex.quote(str(value))}" for key, value in env.items())
    cluster.ssh(host, f"setsid env {assignments} {shlex.join(cmd)} > {log} 2>&1 < /dev/null &")


def wait_for_log(cluster: Cluster, job_dir: str, pattern: str, timeout: float) -> bool:
    """Wait until every worker's trainer logs match `pattern` (e.g. training has begun everywhere)."""
    local_job = cluster.workspace / job_dir.removeprefix(WS + "/")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(any(re.search(pattern, log.read_text(errors="replace"))
                   for log in (local_job / "nodes" / host).glob("trainer*.log")) for host in cluster.workers()):
            return True
        time.sleep(0.5)
    return False


def wait_all_exited(cluster: Cluster, timeout: float) -> tuple[float | None, dict[str, float]]:
    """Seconds until no job process is left on any node (None: still running at the timeout), and per node
    the seconds until its last one exited."""
    start = time.perf_counter()
    last_seen = {host: 0.0 for host in cluster.workers()}
    while time.perf_counter() - start < timeout:
        now = time.perf_counter() - start
        alive = cluster.job_processes()
        for host, procs in alive.items():
            if procs:
                last_seen[host] = now
        if not any(alive.values()):
            return round(now, 2), {host: round(t, 2) for host, t in last_seen.items()}
        time.sleep(0.1)
    return None, {}


def survivors(cluster: Cluster) -> dict[str, list[str]]:
    """What is still running, per node: pid, role and the first words of the command line."""
    out = {}
    for host, procs in cluster.job_processes().items():
        out[host] = []
        for proc in procs:
            try:
                role = proc.environ().get("DGL_ROLE", "launcher")
                out[host].append(f"{proc.pid} {role} {' '.join(proc.cmdline()[1:4])}")
            except psutil.Error:
                pass
    return out


def cleanup(cluster: Cluster, shm_before: dict[str, set[str]]) -> dict[str, int]:
    """Stop the bench unit, SIGKILL what is left by PID, remove the /dev/shm files the job left; returns how many
    /dev/shm files each node had left behind."""
    for host in cluster.workers():
        cluster.ssh(host, f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null", check=False)
    for procs in cluster.job_processes().values():
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
    time.sleep(1)
    left = {}
    for host, before in shm_before.items():
        new = set(cluster.ssh(host, "ls /dev/shm").stdout.split()) - before
        left[host] = len(new)
        if new:
            cluster.ssh(host, "cd /dev/shm && rm -f " + " ".join(shlex.quote(n) for n in new))
    return left


def shm_listing(cluster: Cluster) -> dict[str, set[str]]:
    return {host: set(cluster.ssh(host, "ls /dev/shm").stdout.split()) for host in cluster.workers()}


def listening(cluster: Cluster, port: int) -> dict[str, bool]:
    """Whether each node still has a listener on the DGL server port."""
    return {host: bool(cluster.ssh(host, f"ss -Hltn 'sport = :{port}'", check=False).stdout.strip())
            for host in cluster.workers()}

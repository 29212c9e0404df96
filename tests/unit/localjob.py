"""Helpers for the launcher's tests: free ports, background `dglkit launch` jobs, and the check that a job
left nothing behind. A module of its own (not conftest.py): `from conftest import` finds whichever test
directory's conftest pytest loaded last."""

import os
import subprocess
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"


def free_ports(count: int) -> int:
    """First of `count` consecutive free TCP ports on 127.0.0.1, below the ephemeral range DGL clients use."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 32000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range found")


def build(*args: object) -> None:
    """The CLI in this process (a child would spend seconds importing dgl again); it must exit 0."""
    from dglkit.__main__ import main

    code = main([str(arg) for arg in args])
    assert code == 0, f"dglkit {args} exited {code}"


# Every launcher a test started, so that one a failed test left running is stopped before the next test.
STARTED: list[subprocess.Popen] = []


def start_launch(job_dir: Path, *args: object, pythonpath: tuple[Path, ...] = ()) -> subprocess.Popen:
    """`dglkit launch --job-dir JOB_DIR ARGS` in the background, output in JOB_DIR/launch.out; the job's
    processes import the app and whatever `pythonpath` adds."""
    job_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (APP, *pythonpath)))}
    with open(job_dir / "launch.out", "w") as out:
        launch = subprocess.Popen([sys.executable, "-m", "dglkit", "launch", "--job-dir", job_dir, *map(str, args)],
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    STARTED.append(launch)
    return launch


def stop_started_launchers(grace: float = 30) -> None:
    """SIGTERM every launcher still running (each stops its servers and trainers in order), SIGKILL after
    `grace` seconds (its children then get SIGTERM from the kernel: the launcher sets PDEATHSIG)."""
    for launch in STARTED:
        if launch.poll() is None:
            launch.terminate()
    for launch in STARTED:
        try:
            launch.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            launch.kill()
            launch.wait()
    STARTED.clear()


# Small and fast, yet GraphSAGE clearly beats chance (1/5) on the synthetic graph.
TRAIN_ARGS = ["--num-epochs", "6", "--batch-size", "200", "--lr", "0.01", "--num-hidden", "16", "--log-every", "5"]
# A job that runs until a test stops it.
ENDLESS_TRAIN_ARGS = ["--num-epochs", "500", "--batch-size", "100", "--log-every", "5"]


def local_ports(servers: int) -> tuple[list[object], list[int]]:
    """Free ports for a --local job's `servers` servers and its master: (the launcher's --num-servers,
    --server-port and --master-port options, [server ports..., master port])."""
    base = free_ports(servers + 1)
    options: list[object] = ["--num-servers", servers, "--server-port", base, "--master-port", base + servers]
    return options, list(range(base, base + servers + 1))


def start_local_job(job_dir: Path, part_config: Path, node: str, *args: object,
                    train_args: list[str] = TRAIN_ARGS, servers: int = 1) -> tuple[subprocess.Popen, list[int]]:
    """A --local job with `servers` servers (each a process that imports torch and DGL: one unless a test needs
    backup servers) and 2 trainers on free ports: (launcher, [server ports..., master port])."""
    ports_options, ports = local_ports(servers)
    launch = start_launch(job_dir, "--local", "--part-config", part_config, "--node-name", node, *ports_options,
                          "--num-trainers", 2, *args, "--", *train_args)
    return launch, ports


def epochs_done(job_dir: Path) -> int:
    """Epoch records in the job's metrics.jsonl so far."""
    try:
        lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return sum('"event": "epoch"' in line for line in lines)


def checkpointed_epochs(job_dir: Path) -> int:
    """Epochs that checkpoint.pt holds: those recorded before it was written (rank 0 records an epoch, then
    checkpoints it; the hosts of a --local job share one clock)."""
    import json

    try:
        written = (job_dir / "checkpoint.pt").stat().st_mtime
        lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    # A line being written has no end yet and counts once it has.
    records = [json.loads(line) for line in lines if '"event": "epoch"' in line and line.endswith("}")]
    return sum(record["time"] <= written for record in records)


def kill_trainer_after(job_dir: Path, launch: subprocess.Popen, epochs: int, node: str, rank: int = 1) -> None:
    """SIGKILL trainer `rank` of a running --local job once `epochs` epochs are recorded and checkpointed."""
    import json

    import psutil

    deadline = time.time() + 480
    while checkpointed_epochs(job_dir) < epochs:
        assert launch.poll() is None and time.time() < deadline, (job_dir / "launch.out").read_text()[-3000:]
        time.sleep(0.3)
    status = json.loads((job_dir / f"nodes/{node}/status.json").read_text())
    psutil.Process(next(p["pid"] for p in status["processes"] if p["name"] == f"trainer-{rank}")).kill()


def assert_job_gone(job_dir: Path, ports: list[int], shm_before: set[str]) -> None:
    """No process (servers, trainers, samplers: they carry DGL_IP_CONFIG), listening port or /dev/shm file
    of the job is left."""
    import psutil

    left = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DGL_IP_CONFIG", "").startswith(str(job_dir)) and proc.status() != "zombie":
                left.append((proc.pid, proc.cmdline()))
        except psutil.Error:
            pass
    assert not left, f"processes of the job still running: {left}"
    # A port still listening 10 s after the launcher ended is left behind; its owner is named.
    deadline = time.time() + 10
    while True:
        listening = [(c.laddr, c.pid) for c in psutil.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port in ports]
        if not listening or time.time() > deadline:
            break
        time.sleep(0.5)
    owners = {}
    for _, pid in listening:
        try:
            owners[pid] = psutil.Process(pid).cmdline() if pid else "?"
        except psutil.Error as error:
            owners[pid] = repr(error)
    assert not listening, f"job ports still listening: {listening}, owners {owners}"
    # Another test session's live DGL server may own new files; files nobody holds are the job's leftovers.
    held = set()
    for proc in psutil.process_iter():
        try:
            held.update(Path(m.path).name for m in proc.memory_maps() if m.path.startswith("/dev/shm/"))
            held.update(Path(f.path).name for f in proc.open_files() if f.path.startswith("/dev/shm/"))
        except psutil.Error:
            pass
    leftovers = set(os.listdir("/dev/shm")) - shm_before - held
    assert not leftovers, f"/dev/shm files left behind: {sorted(leftovers)}"

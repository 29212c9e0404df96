"""Benchmark a job's wall time through train.yml against DGL's own tools/launch.py.

On one test cluster (storage host node1, workers node2 and node3, `dglkit_ssh_mesh: true` so that launch.py can
SSH between the workers as the job account) the same DGL-example-style program (tests/programs/train_dist,
5 epochs) trains on the same partition of the 100k-node synthetic graph, alternately:

- through `ansible-playbook playbooks/train.yml` as a user runs it (own program settings, dgl_job_force so that
  it really runs), from this machine;
- through DGL's launch.py (not in DGL's wheel: --launch-py gives its path; it is copied to the test cluster's
  workspace, never into the project), started over SSH on the first worker as the job account, with the
  program's environment and directory that train.yml's first run shipped.

A first train.yml run, not counted, prepares and partitions the dataset and ships the program. Per run the
script prints and appends to bench/results/launch_overhead.jsonl: controller start -> first trainer process
(its start time from /proc: the test hosts' processes are this machine's), -> first epoch and last epoch -> end
(the program's epoch records carry their time; the hosts share this machine's clock), and the whole wall.

    .venv/bin/python bench/launch_overhead.py --launch-py /path/to/dgl/tools/launch.py [--runs 5]
    .venv/bin/python bench/launch_overhead.py --table [--since 2026-12-05T01]
"""

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

import benchlib

sys.path.insert(0, str(benchlib.REPO))  # a script: the repository, for the test clusters' client
from tests.cluster.clusterclient import Cluster, named  # noqa: E402

PROGRAM = benchlib.REPO / "tests" / "programs" / "train_dist"
ACCOUNT_UID = 30050
# What the results record in place of --launch-py's path (a copy outside the repository).
LAUNCH_PY = "'<DGL tools/launch.py>'"
PHASES = ["to_trainer_s", "to_first_epoch_s", "after_last_epoch_s", "wall_s"]
# Where train.yml's seconds go: Ansible's profile_tasks callback lists every task's time at the end (a
# timestamp per task: no round trip added). launch.py's output has no such lines.
PROFILE = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks", "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "500",
           "PROFILE_TASKS_SORT_ORDER": "none"}
TASK_TIME = re.compile(r"^(.+?) -+ ?\s*(\d+\.\d+)s$", re.M)


def program_args(epochs: int) -> str:
    # --features feat: the kit's partitions store `feat`; launch.py has no renaming, so both runs read it.
    return (f"train_dist.py --graph_name {{graph_name}} --ip_config {{ip_config}} --part_config {{part_config}} "
            f"--num_epochs {epochs} --features feat --output_dir {{output_dir}}")


def train_yml(cluster: Cluster, epochs: int, nodes: int) -> list[str]:
    settings = {"dgl_job_run_dir": str(cluster.dir / "runs"), "dgl_program_dir": str(PROGRAM),
                "dgl_program_command": "python3 " + program_args(epochs), "dgl_job_dataset": "synthetic",
                "dgl_job_synthetic_nodes": nodes, "dgl_job_force": True}
    return [str(benchlib.REPO / ".venv/bin/ansible-playbook"), "-i", str(cluster.inventory), "playbooks/train.yml",
            "-e", json.dumps(settings)]


class TrainerWatch(threading.Thread):
    """The start time of the first trainer process (DGL_ROLE=client with RANK set: torchrun's child under
    launch.py, the launcher's under train.yml) on a host of this cluster (its cgroup; other clusters on the
    machine have the same job account), from /proc. Trainers live for the whole job, so a coarse poll still
    reads their exact start."""

    def __init__(self, cluster: str) -> None:
        super().__init__(daemon=True)
        self.first: float | None = None
        self.done = threading.Event()
        self.cgroup = re.compile(rf"/dglkit-{re.escape(cluster)}-node\d+/")

    def run(self) -> None:
        while not self.done.wait(0.3) and self.first is None:
            for proc in psutil.process_iter(["uids", "create_time"]):
                if proc.info["uids"] is None or proc.info["uids"].real != ACCOUNT_UID:
                    continue
                try:
                    env = proc.environ()
                    if not self.cgroup.search(Path(f"/proc/{proc.pid}/cgroup").read_text()):
                        continue
                except (psutil.Error, OSError):
                    continue
                if env.get("DGL_ROLE") == "client" and "RANK" in env:
                    self.first = min(self.first or proc.info["create_time"], proc.info["create_time"])


def timed(cluster: Cluster, cmd: list[str], metrics: Path) -> dict:
    """Run cmd to its end and time the phases; metrics is the program's metrics.jsonl (the controller's view)."""
    metrics.unlink(missing_ok=True)
    watch = TrainerWatch(cluster.name)
    watch.start()
    start = time.time()
    proc = subprocess.run(cmd, cwd=benchlib.REPO, capture_output=True, text=True, check=False,
                          env={**os.environ, **PROFILE, "ANSIBLE_NOCOLOR": "1"})
    end = time.time()
    watch.done.set()
    watch.join()
    epochs = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("event") == "epoch"] \
        if metrics.is_file() else []
    if proc.returncode or not epochs or watch.first is None:
        sys.exit(f"error: `{shlex.join(cmd)}` exited {proc.returncode} ({len(epochs)} epochs, trainer seen: "
                 f"{watch.first is not None}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    tasks: dict[str, float] = {}
    for name, seconds in TASK_TIME.findall(proc.stdout.rpartition("=" * 20)[2]):
        tasks[name] = round(tasks.get(name, 0) + float(seconds), 2)
    return {"tasks": tasks, "to_trainer_s": round(watch.first - start, 2),
            "to_first_epoch_s": round(epochs[0]["time"] - start, 2),
            "after_last_epoch_s": round(end - epochs[-1]["time"], 2), "wall_s": round(end - start, 2),
            "epochs": len(epochs), "epoch_s": round(statistics.median(r["epoch_time"] for r in epochs), 3),
            "load": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch-py", type=Path, help="DGL's tools/launch.py (required unless --table)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each launcher, alternating")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=100_000, help="synthetic graph's nodes")
    parser.add_argument("--name", default="launch",
                        help="test cluster name (DGLKIT_CLUSTER_PREFIX is prepended)")
    parser.add_argument("--keep", action="store_true", help="keep the test cluster afterwards")
    benchlib.add_common_arguments(parser, "1 run each, 2 epochs")
    args = benchlib.parse(parser, "launch_overhead", print_table)
    if args is None:
        return
    if not args.launch_py or not args.launch_py.is_file():
        parser.error("--launch-py: give the path of DGL's tools/launch.py")
    benchlib.COMMAND = benchlib.COMMAND.replace(shlex.quote(str(args.launch_py)), LAUNCH_PY)
    if args.quick:
        args.runs, args.epochs = 1, 2
    cluster = named(args.name)
    try:
        measure_all(cluster, args)
    finally:
        if not args.keep:
            cluster.down()
    print_table(benchlib.load("launch_overhead", since=START))


START = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def measure_all(cluster: Cluster, args: argparse.Namespace) -> None:
    cluster.up(3)
    (cluster.inventory / "group_vars/all/bench.yml").write_text("dglkit_ssh_mesh: true\n")
    cluster.stand_up()
    playbook = train_yml(cluster, args.epochs, args.nodes)
    first = subprocess.run(playbook, cwd=benchlib.REPO, capture_output=True, text=True, check=False)
    if first.returncode:
        sys.exit(f"error: the first train.yml run failed:\n{(first.stdout + first.stderr)[-4000:]}")
    # The summary names it: a kept cluster's runs/ also holds the jobs of earlier versions of the program.
    run_folder = Path(re.findall(r"run folder: (/[^\s'\"]+)", first.stdout)[-1])
    job = json.loads((run_folder / "job.json").read_text())
    kit_metrics = cluster.workspace / job["job_dir"].removeprefix("/srv/dglkit/") / "metrics.jsonl"

    # launch.py's run: its own output directory, owned by the job account, and launch.py on the workspace.
    plain = cluster.workspace / "jobs" / "bench-launch-py"
    plain.mkdir(exist_ok=True)
    os.chown(plain, ACCOUNT_UID, ACCOUNT_UID)
    shutil.copy(args.launch_py, cluster.workspace / "dgl_launch.py")
    workers = list(cluster.groups()["workers"])
    command = f"{job['python_env']}/bin/python3 " + program_args(args.epochs).format(
        graph_name=Path(job["part_config"]).stem, ip_config=job["ip_config"], part_config=job["part_config"],
        output_dir="/srv/dglkit/jobs/bench-launch-py")
    launch = ["/srv/dglkit/venv/bin/python", "/srv/dglkit/dgl_launch.py",
              "--extra_envs", "GLOO_SOCKET_IFNAME=eth0", "DGLBACKEND=pytorch",
              "--workspace", job["program_dir"], "--num_trainers", "1", "--num_samplers", "0", "--num_servers", "1",
              "--part_config", job["part_config"], "--ip_config", job["ip_config"], command]
    ssh = ["ssh", "-F", str(cluster.dir / "ssh" / "config"), workers[0],
           "runuser -u dglkit -- " + shlex.join(launch)]
    params = {"epochs": args.epochs, "nodes": args.nodes, "workers": len(workers)}
    for run in range(args.runs):
        for launcher, cmd, metrics in [("train.yml", playbook, kit_metrics), ("launch.py", ssh, plain / "metrics.jsonl")]:
            figures = timed(cluster, cmd, metrics)
            benchlib.report("launch_overhead", {**params, "launcher": launcher, "run": run}, figures)


def print_table(records: list[dict]) -> None:
    """Per commit (before/after a change), per launcher: the median of each phase, then the ratios."""
    rows = []
    for commit in dict.fromkeys(r["commit"] for r in records):
        by = {launcher: [r["figures"] for r in records if r["commit"] == commit and r["params"]["launcher"] == launcher]
              for launcher in ("train.yml", "launch.py")}
        for launcher, figures in by.items():
            if figures:
                rows.append([commit, launcher, len(figures)]
                            + [benchlib.spread([f[p] for f in figures]) for p in PHASES + ["epoch_s", "load"]])
        if by["train.yml"] and by["launch.py"]:
            kit, plain = ({p: statistics.median(f[p] for f in by[launcher]) for p in PHASES} for launcher in by)
            rows.append([commit, "train.yml vs launch.py", "",
                         f"{kit['to_trainer_s'] - plain['to_trainer_s']:+.1f} s",
                         f"{kit['to_first_epoch_s'] - plain['to_first_epoch_s']:+.1f} s",
                         f"{kit['after_last_epoch_s'] - plain['after_last_epoch_s']:+.1f} s",
                         f"{kit['wall_s'] / plain['wall_s']:.2f}x", "", ""])
    print(benchlib.table(["commit", "launcher", "runs", "start -> first trainer, s", "start -> first epoch, s",
                          "last epoch -> end, s", "wall, s", "epoch, s", "load"], rows))
    print()
    print_tasks(records)


def print_tasks(records: list[dict]) -> None:
    """train.yml's slowest tasks per commit: the median seconds over its runs (profile_tasks)."""
    rows = []
    for commit in dict.fromkeys(r["commit"] for r in records):
        runs = [r["figures"]["tasks"] for r in records
                if r["commit"] == commit and r["params"]["launcher"] == "train.yml" and r["figures"].get("tasks")]
        if not runs:
            continue
        names = dict.fromkeys(name for run in runs for name in run)
        medians = {name: statistics.median(run.get(name, 0) for run in runs) for name in names}
        top = sorted(medians, key=medians.get, reverse=True)[:TOP_TASKS]
        rows += [[commit, name, benchlib.number(medians[name])] for name in top]
        rows.append([commit, f"all {len(names)} tasks", benchlib.number(sum(medians.values()))])
    print(benchlib.table(["commit", "train.yml task (profile_tasks)", "median, s"], rows))


TOP_TASKS = 15


if __name__ == "__main__":
    main()

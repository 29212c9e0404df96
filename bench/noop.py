"""Benchmark the playbooks that have nothing to do: site.yml re-run on a set-up cluster, status.yml and stop.yml
with no job and after a finished one, and train.yml re-run for a finished job. Wall time and module runs per host
(plugins/callback/contacts.py), the slowest tasks (profile_tasks) in the logs. Appends to bench/results/noop.jsonl.

    .venv/bin/python bench/noop.py --runs 5                    # 4 hosts: node1 storage, node2-4 workers
    .venv/bin/python bench/noop.py --runs 5 --repo ../other-checkout  # the same with another checkout's playbooks
    .venv/bin/python bench/noop.py --table

The cluster is stood up from the venv seed the e2e tier keeps (tests/cluster/clusterclient.py), one small job is run
for the finished-job rows, and the cluster is taken down at the end unless --keep-cluster.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

sys.path.insert(0, str(benchlib.REPO))  # a script: the repository, for the test clusters' client
from tests.cluster.clusterclient import Cluster, named  # noqa: E402

# A job that finishes in seconds: the finished job that status.yml, stop.yml and train.yml look at.
JOB = ["-e", "dgl_job_synthetic_nodes=5000", "-e", "dgl_job_epochs=1", "-e", "dgl_job_batch_size=100"]
# (playbook, extra arguments, the state of the cluster's job) in the order they run.
NO_JOB = [("site.yml", []), ("playbooks/status.yml", []), ("playbooks/stop.yml", [])]
FINISHED = [("playbooks/status.yml", []), ("playbooks/stop.yml", []), ("playbooks/train.yml", JOB)]
RECAP_RE = re.compile(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", re.M)
TASK_TIME_RE = re.compile(r"^(.+?) -{3,} (\d+\.\d+)s$", re.M)
LOGS = Path("/var/tmp/dglkit-bench/logs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each playbook (medians reported)")
    parser.add_argument("--hosts", type=int, default=4, help="node1 storage, the others workers")
    parser.add_argument("--name", default="noop", help="test cluster name (DGLKIT_CLUSTER_PREFIX is prepended)")
    parser.add_argument("--repo", type=Path, default=benchlib.REPO, help="the checkout whose playbooks run")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    benchlib.add_common_arguments(parser, "one run of each")
    args = benchlib.parse(parser, "noop", print_table)
    if args is None:
        return
    if args.quick:
        args.runs = 1
    LOGS.mkdir(parents=True, exist_ok=True)
    cluster = named(args.name)
    cluster.up(args.hosts)
    try:
        cluster.stand_up()
        rows = []
        for label, playbooks in (("no job", NO_JOB), ("finished job", FINISHED)):
            if label == "finished job":
                playbook(cluster, args.repo, "playbooks/train.yml", JOB, LOGS / f"{args.name}-job.log")
            for n in range(args.runs):
                for name, extra in playbooks:
                    rows.append(record(cluster, args, name, extra, label, n))
        print_table(rows)
    finally:
        if not args.keep_cluster:
            cluster.down()


def playbook(cluster: Cluster, repo: Path, name: str, extra: list[str], log: Path) -> dict:
    """One ansible-playbook run from `repo`: wall time, recap totals, module runs per host, the slowest tasks."""
    with tempfile.NamedTemporaryFile(suffix=".json") as counts:
        env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_CALLBACK_PLUGINS": str(benchlib.REPO / "plugins/callback"),
               "ANSIBLE_CALLBACKS_ENABLED": "contacts,ansible.posix.profile_tasks", "DGLKIT_CONTACTS_FILE": counts.name}
        cmd = [str(benchlib.REPO / ".venv/bin/ansible-playbook"), "-i", str(cluster.inventory), name, *extra]
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        wall = round(time.perf_counter() - start, 2)
        contacts = json.loads(Path(counts.name).read_text() or "{}").get("hosts", {})
    log.write_text(proc.stdout + proc.stderr)
    recap = [dict(pair.split("=") for pair in c.split()) for _, c in RECAP_RE.findall(proc.stdout.rpartition("PLAY RECAP")[2])]
    slowest = sorted(((float(t), task.strip()) for task, t in TASK_TIME_RE.findall(proc.stdout)), reverse=True)[:5]
    if proc.returncode:
        print(f"{name} exited {proc.returncode}: see {log}", file=sys.stderr)
    return {"wall_s": wall, "returncode": proc.returncode, "log": str(log),
            "changed": sum(int(r["changed"]) for r in recap), "contacts": contacts,
            "slowest_tasks": [[task, t] for t, task in slowest],
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def record(cluster: Cluster, args: argparse.Namespace, name: str, extra: list[str], label: str, n: int) -> dict:
    log = LOGS / f"{args.name}-{Path(name).stem}-{label.replace(' ', '-')}-{n}.log"
    figures = playbook(cluster, args.repo, name, extra, log)
    commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=args.repo, capture_output=True,
                            text=True).stdout.strip()
    params = {"playbook": name, "job": label, "hosts": args.hosts, "repo": str(args.repo), "repo_commit": commit,
              "run": n}
    line = benchlib.append("noop", {"params": params, "figures": figures})
    print(f"{name} ({label}), run {n}: {figures['wall_s']} s, changed {figures['changed']}, module runs "
          f"{figures['contacts']}, load {figures['load_before']}->{figures['load_after']}", flush=True)
    return line


def print_table(rows: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        p = row["params"]
        groups.setdefault((p["repo_commit"], p["hosts"], p["playbook"], p["job"]), []).append(row)
    out = []
    for (commit, hosts, name, job), lines in groups.items():
        f = [line["figures"] for line in lines]
        storage = [x["contacts"].get("node1", 0) for x in f]
        worker = [max((n for h, n in x["contacts"].items() if h not in ("node1", "localhost")), default=0) for x in f]
        loads = [x["load_before"] for x in f] + [x["load_after"] for x in f]
        out.append([commit, hosts, name, job, benchlib.spread([x["wall_s"] for x in f if x["returncode"] == 0]),
                    f"{max(storage)} / {max(worker)}", "/".join(str(x["changed"]) for x in f),
                    sum(x["returncode"] != 0 for x in f), f"{min(loads):g}-{max(loads):g}"])
    print(benchlib.table(["commit", "hosts", "playbook", "job", "wall s", "module runs: storage / worker",
                          "changed", "failed runs", "load 1m"], out))


if __name__ == "__main__":
    main()

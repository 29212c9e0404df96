"""Benchmark failure handling: SIGKILL a DGL server or trainer on one node mid-training, then time until every
process of the job on every node has exited, with the kit's launcher versus DGL's plain launch.py contract
(which hangs: the wait is bounded). Appends to bench/results/failure.jsonl.

    .venv/bin/python bench/failure.py --runs 3
    .venv/bin/python bench/failure.py --quick
"""

import argparse
import os
import signal
import time

import benchlib
import clusterlib
from dglkit.common import read_json

TRAIN_ARGS = ["--num-epochs", "1000", "--log-every", "1", "--batch-size", "1000"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default="bench", help="test cluster name (started if needed)")
    parser.add_argument("--hosts", type=int, default=2, help="workers in the cluster")
    parser.add_argument("--launchers", default="kit,plain", help="comma list of kit, plain")
    parser.add_argument("--targets", default="server,trainer", help="comma list of server, trainer")
    parser.add_argument("--node", help="node whose process is killed (default: the last worker)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120, help="longest wait for the job to go away")
    parser.add_argument("--nodes", type=int, default=50_000, help="synthetic graph size")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running afterwards")
    benchlib.add_common_arguments(parser, "one run, server only, 30 s bound")
    args = benchlib.parse(parser, "failure", print_table)
    if args is None:
        return
    if args.quick:
        args.runs, args.targets, args.timeout = 1, "server", 30

    with clusterlib.session(args.cluster, args.hosts, args.keep_cluster) as cluster:
        part_config = clusterlib.partition(cluster, args.nodes, 10)
        victim_node = args.node or list(cluster.workers())[-1]
        rows = []
        for launcher in args.launchers.split(","):
            for target in args.targets.split(","):
                for run in range(args.runs):
                    figures = one_run(cluster, launcher, target, victim_node, part_config, args.timeout)
                    params = {"launcher": launcher, "target": target, "victim_node": victim_node, "run": run,
                              "hosts": args.hosts, "graph_nodes": args.nodes, "timeout_s": args.timeout}
                    rows.append(benchlib.report("failure", params, figures))
        print_table(rows)

def one_run(cluster: clusterlib.Cluster, launcher: str, target: str, node: str, part_config: str,
            timeout: float) -> dict:
    shm_before = clusterlib.shm_listing(cluster)
    job_dir = clusterlib.new_job_dir(cluster, f"fail-{launcher}-{target}")
    if launcher == "kit":
        clusterlib.start_kit(cluster, job_dir, part_config, {}, TRAIN_ARGS)
    else:
        clusterlib.start_plain(cluster, job_dir, part_config, TRAIN_ARGS)
    try:
        figures = kill_and_wait(cluster, job_dir, target, node, timeout)
    finally:
        shm_left = clusterlib.cleanup(cluster, shm_before)
    return {**figures, "shm_files_left": shm_left}


def kill_and_wait(cluster: clusterlib.Cluster, job_dir: str, target: str, node: str, timeout: float) -> dict:
    victim = None
    if clusterlib.wait_for_log(cluster, job_dir, r"epoch \d+ step", 300):
        time.sleep(2)  # well into training, not at its first step
        victim = find(cluster, node, target)
    if victim is None:
        return {"error": f"training did not start within 300 s or no {target} on {node}",
                "survivors": clusterlib.survivors(cluster)}
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    total, per_node = clusterlib.wait_all_exited(cluster, timeout)
    figures = {"all_exited_s": total, "per_node_last_exit_s": per_node, "victim_pid": victim}
    if total is None:
        figures["survivors"] = clusterlib.survivors(cluster)
        figures["listening_after_timeout"] = clusterlib.listening(cluster, 30050)
    failed = read_json(cluster.workspace / job_dir.removeprefix(clusterlib.WS + "/") / "FAILED")
    if failed:
        figures["failed_file"] = {key: failed.get(key) for key in ("node", "process", "exit_code", "reason")}
        figures["detected_s"] = round(failed["time"] - killed_at, 2)
    return figures


def find(cluster: clusterlib.Cluster, node: str, target: str) -> int | None:
    """PID of the DGL server (DGL_ROLE=server) or the trainer (RANK set, not a sampler) on node."""
    for proc in cluster.job_processes().get(node, []):
        try:
            env, cmdline = proc.environ(), proc.cmdline()
        except Exception:
            continue
        # `python [-u] -m dglkit train`: not a plain run's torchrun (-m torch.distributed.run), not a sampler (-c)
        runs_train = "-m" in cmdline and cmdline[cmdline.index("-m") + 1:][:2] == ["dglkit", "train"]
        if target == "server" and env.get("DGL_ROLE") == "server" and runs_train:
            return proc.pid
        if target == "trainer" and env.get("DGL_ROLE") == "client" and "RANK" in env and runs_train:
            return proc.pid
    return None


def print_table(rows: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["params"]["launcher"], row["params"]["target"]), []).append(row)
    out = []
    for (launcher, target), lines in sorted(groups.items()):
        f = [line["figures"] for line in lines]
        done = [x["all_exited_s"] for x in f if x.get("all_exited_s") is not None]
        hung = len([x for x in f if "all_exited_s" in x and x["all_exited_s"] is None])
        timeout = lines[0]["params"]["timeout_s"]
        cell = benchlib.spread(done) if done else "-"
        if hung:
            cell += f"; {hung} of {len(f)} runs > {timeout:g} s, still running"
        reasons = {f"{x['failed_file']['node']} {x['failed_file']['process']}: {x['failed_file']['reason']}"
                   for x in f if x.get("failed_file")}
        out.append([launcher, f"{target} on {lines[0]['params']['victim_node']}", cell,
                    benchlib.spread([x.get("detected_s") for x in f]),
                    sum(sum(x.get("shm_files_left", {}).values()) for x in f), "; ".join(sorted(reasons)) or "-"])
    print(benchlib.table(["launcher", "SIGKILL", "all processes on all nodes gone, s", "FAILED written after, s",
                          "/dev/shm files left behind (all runs)", "reported"], out))


if __name__ == "__main__":
    main()

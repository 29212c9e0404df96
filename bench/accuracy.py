#!/usr/bin/env python3
"""Distributed test accuracy against one machine with the same settings.

One machine: `dglkit launch --local` on a 1-part partition of the graph, on this machine. N workers: the same
graph (same generator seed, checked by its fingerprint) METIS-partitioned for N, `dglkit launch` on an nspawn
test cluster of N hosts as train.yml starts it. Same train arguments everywhere, one trainer per machine; each
seed is one job. Prints and stores (bench/results/accuracy.jsonl) per job: test accuracy of the best
validation model and of the final model; the table gives mean and spread per worker count and the difference
from one machine. The graph is the kit's synthetic one: power-law degrees, communities that only partly
follow the classes' features, 10% of labels redrawn at random, so it is neither separable nor trivial.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import clusterlib

APP = benchlib.REPO / "app"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20_000, help="synthetic graph size (%(default)s)")
    parser.add_argument("--degree", type=float, default=12, help="its average degree (%(default)s)")
    # At lr 0.01 one machine's validation accuracy levels off by epoch 15 (20k nodes): 20 epochs compare
    # trained models, although N workers take 1/N of the steps per epoch.
    parser.add_argument("--epochs", type=int, default=20, help="epochs per job (%(default)s)")
    parser.add_argument("--seeds", default="0,1,2", help="comma list: one job per seed and worker count")
    parser.add_argument("--workers", default="2,4",
                        help="comma list of distributed worker counts (empty: one machine only)")
    parser.add_argument("--train-args", default="--batch-size 256 --lr 0.01 --num-hidden 64 --dropout 0.5 "
                        "--weight-decay 0.0005", help="train arguments of every job (%(default)s)")
    parser.add_argument("--timeout", type=float, default=1200, help="longest a job may take")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the clusters running afterwards")
    benchlib.add_common_arguments(parser, "5k nodes, 3 epochs, 1 seed, 2 workers")
    args = benchlib.parse(parser, "accuracy", print_table)
    if args is None:
        return
    if args.quick:
        args.nodes, args.epochs, args.seeds, args.workers = 5000, 3, "0", "2"
    seeds = [int(s) for s in args.seeds.split(",")]
    # The graph clusterlib.partition() prepares on the cluster (100 features; generator defaults: 10 classes, seed 0).
    graph = ["--dataset", "synthetic", "--num-nodes", str(args.nodes), "--avg-degree", str(args.degree),
             "--feat-dim", "100"]
    params = {"graph_nodes": args.nodes, "degree": args.degree, "epochs": args.epochs, "train_args": args.train_args}

    rows = []
    with tempfile.TemporaryDirectory(prefix="dglkit-accuracy-") as tmp:
        fingerprint = local_partition(Path(tmp), graph)
        for seed in seeds:
            rows.append(benchlib.report("accuracy", {**params, "workers": 1, "seed": seed, "fingerprint": fingerprint},
                                        local_job(Path(tmp), train_args(args, seed), args.timeout)))
    for workers in (int(w) for w in args.workers.split(",") if w):
        with clusterlib.session(f"acc{workers}", workers, args.keep_cluster) as cluster:
            part_config = clusterlib.partition(cluster, args.nodes, args.degree)
            dataset = cluster.workspace / "datasets" / f"bench-{args.nodes}-{args.degree}" / "dataset.json"
            cluster_fingerprint = json.loads(dataset.read_text())["fingerprint"]
            if cluster_fingerprint != fingerprint:
                sys.exit(f"error: the cluster's graph {cluster_fingerprint} differs from this machine's {fingerprint}")
            for seed in seeds:
                figures = cluster_job(cluster, part_config, train_args(args, seed), args.timeout)
                rows.append(benchlib.report("accuracy", {**params, "workers": workers, "seed": seed,
                                                         "fingerprint": fingerprint}, figures))
    print_table(rows)


def train_args(args: argparse.Namespace, seed: int) -> list[str]:
    return ["--num-epochs", str(args.epochs), *args.train_args.split(), "--seed", str(seed)]


def dglkit(*args: str) -> dict:
    """`python -m dglkit ARGS` on this machine with the repository's app; its result line."""
    proc = subprocess.run([benchlib.PYTHON, "-m", "dglkit", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(APP)})
    if proc.returncode:
        sys.exit(f"error: dglkit {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def local_partition(tmp: Path, graph: list[str]) -> str:
    prepared = dglkit("prepare", *graph, "--out", str(tmp / "data"))
    dglkit("partition", "--dataset-dir", str(tmp / "data"), "--out", str(tmp / "part1"), "--num-parts", "1",
           "--graph-name", "dglkit_accuracy")
    return prepared["fingerprint"]


def local_job(tmp: Path, train: list[str], timeout: float) -> dict:
    """One machine, one trainer: the same launcher and trainer as on the cluster (--local)."""
    job_dir = tmp / f"job-{time.strftime('%H%M%S')}-{len(list(tmp.glob('job-*')))}"
    # The launcher runs its program from the job directory, which must exist (train.yml creates it on the cluster).
    job_dir.mkdir()
    proc = subprocess.run([benchlib.PYTHON, "-m", "dglkit", "launch", "--local", "--job-dir", str(job_dir),
                           "--part-config", str(tmp / "part1" / "dglkit_accuracy.json"), "--num-trainers", "1",
                           "--", *train], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(APP)})
    return figures(job_dir, proc.returncode == 0)


def cluster_job(cluster: clusterlib.Cluster, part_config: str, train: list[str], timeout: float) -> dict:
    shm_before = clusterlib.shm_listing(cluster)
    job_dir = clusterlib.new_job_dir(cluster, "accuracy")
    clusterlib.start_kit(cluster, job_dir, part_config, {"num_trainers": 1}, train)
    try:
        total, _ = clusterlib.wait_all_exited(cluster, timeout)
    finally:
        clusterlib.cleanup(cluster, shm_before)
    return figures(cluster.workspace / job_dir.removeprefix(clusterlib.WS + "/"), total is not None)


def figures(job_dir: Path, exited: bool) -> dict:
    result = json.loads((job_dir / "result.json").read_text()) if (job_dir / "result.json").is_file() else None
    if result is None:
        return {"ok": False, "exited": exited}
    return {"ok": exited, **{key: round(result[key], 4) for key in ("best_test_acc", "test_acc", "best_val_acc")},
            "best_epoch": result["best_epoch"], "load": round(os.getloadavg()[0], 2)}


def print_table(rows: list[dict]) -> None:
    by_workers: dict[int, list[dict]] = {}
    for row in rows:
        if row["figures"].get("ok"):
            by_workers.setdefault(row["params"]["workers"], []).append(row["figures"])
    if 1 not in by_workers:
        print("no single-machine result")
        return
    base = {key: statistics.fmean(f[key] for f in by_workers[1]) for key in ("best_test_acc", "test_acc")}
    print(f"{'workers':>7} {'n':>3} {'best-val model test acc':>25} {'final model test acc':>22} {'diff (best)':>12} "
          f"{'diff (final)':>13}")
    for workers, found in sorted(by_workers.items()):
        cells = []
        for key in ("best_test_acc", "test_acc"):
            values = [f[key] for f in found]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{100 * statistics.fmean(values):6.2f} ± {100 * spread:4.2f}")
        diffs = [100 * (statistics.fmean(f[key] for f in found) - base[key]) for key in ("best_test_acc", "test_acc")]
        print(f"{workers:>7} {len(found):>3} {cells[0]:>25} {cells[1]:>22} {diffs[0]:>+12.2f} {diffs[1]:>+13.2f}")


if __name__ == "__main__":
    main()

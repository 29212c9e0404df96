"""Link-prediction training speed on a test cluster of 2 (or --workers) workers: the kit's trainer
(`dglkit train --task link_prediction`) against DGL 2.1's unsupervised GraphSAGE example
(tests/programs/train_dist_unsupervised), on the same partition of a synthetic graph with held-out edges.

Each configuration runs as a program through the kit's launcher from its own copy of the code (this checkout's
app/, `--base REV`'s app/ from git, the example's directory), so the measured code is what is named, whatever
app/ the cluster was stood up with. Per epoch: training time (the slowest trainer's, evaluation excluded) and
training edges/s over all trainers; the kit's evaluation time per epoch separately; the eval metric (the kit's
test MRR against --eval-negs random nodes; the example's logistic-regression test accuracy on its embeddings).
Configurations alternate within a run so that the shared machine's load hits all alike. Appends to
bench/results/linkpred.jsonl.

    .venv/bin/python bench/linkpred.py --runs 2 --base 5680585
    .venv/bin/python bench/linkpred.py --quick
    .venv/bin/python bench/linkpred.py --work --nodes 100000

`--work` runs no job: on this machine, per training edge, what a batch of each sampling setting samples (seed
nodes, input nodes whose features are read, sampled edges), DGL's Uniform(k) negatives against the kit's pool.
Counts, not times: the shared machine's load does not move them.
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
import tempfile
import time

import benchlib
import clusterlib

EXAMPLE = benchlib.REPO / "tests" / "programs" / "train_dist_unsupervised"
KIT_COMMAND = ("python3 -m dglkit train --ip-config {ip_config} --part-config {part_config} --out-dir {output_dir} "
               "--task link_prediction --checkpoint-every 0 ")
EXAMPLE_COMMAND = ("python3 train_dist_unsupervised.py --graph_name {graph_name} --ip_config {ip_config} "
                   "--part_config {part_config} ")
# Sampling settings as each program names them: batch size (edges), fan-out, negatives per edge, hidden units.
CONFIGS = {
    # DGL's example with its own defaults.
    "example": (EXAMPLE_COMMAND, {}),
    # The kit with the example's settings: like with like.
    "kit-as-example": (KIT_COMMAND, {"--batch-size": "1000", "--fan-out": "10,25", "--num-negs": "1",
                                     "--num-hidden": "32", "--lr": "0.003", "--seed": "0"}),
    # The kit with dgl_job's defaults but the example's batch size: the batch size is the lever (BENCHMARKS.md).
    "kit-batch1000": (KIT_COMMAND, {"--batch-size": "1000", "--fan-out": "10,25", "--num-negs": "5",
                                    "--num-hidden": "64", "--lr": "0.01", "--eval-negs": "100", "--seed": "0"}),
    # The kit with dgl_job's defaults (roles/dgl_job/defaults/main.yml).
    "kit-defaults": (KIT_COMMAND, {"--batch-size": "256", "--fan-out": "10,25", "--num-negs": "5",
                                   "--num-hidden": "64", "--lr": "0.01", "--eval-negs": "100", "--seed": "0"}),
}
EXAMPLE_SETTINGS = {"--batch-size": "1000", "--fan-out": "10,25", "--num-negs": "1", "--num-hidden": "32",
                    "--lr": "0.003"}
EPOCH_LINE = re.compile(r"\[(\d+)\] Epoch (\d+) \| Loss [0-9.]+ \| Time ([0-9.]+)s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="workers (node1, the storage host, is one of them)")
    parser.add_argument("--nodes", type=int, default=20_000, help="synthetic graph size (%(default)s)")
    parser.add_argument("--degree", type=float, default=25, help="its average degree (%(default)s)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per job (%(default)s)")
    parser.add_argument("--runs", type=int, default=2, help="jobs per configuration")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma list of " + ", ".join(CONFIGS))
    parser.add_argument("--base", help="git revision whose kit trainer runs too (configurations with several "
                        "negatives per edge), labelled with it")
    parser.add_argument("--timeout", type=float, default=1800, help="longest a job may take")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--work", action="store_true", help="only count what batches sample, on this machine")
    benchlib.add_common_arguments(parser, "5k nodes, 1 epoch, 1 run")
    args = benchlib.parse(parser, "linkpred", print_table)
    if args is None:
        return
    if args.work:
        print_work(args.nodes, args.degree)
        return
    if args.quick:
        args.nodes, args.epochs, args.runs = 5000, 1, 1
    prefix = os.environ.get("DGLKIT_CLUSTER_PREFIX", "")
    with clusterlib.session(f"{prefix}linkpred", args.workers, args.keep_cluster) as cluster:
        part_config = partition(cluster, args.nodes, args.degree)
        codes = {"example": ship(cluster, "example", EXAMPLE), "kit": ship(cluster, "kit", benchlib.REPO / "app")}
        revisions = {"kit": benchlib.git_commit()}
        if args.base:
            codes["base"] = ship_revision(cluster, args.base)
            revisions["base"] = args.base
        # The base runs where the code changed what a batch samples: several negatives per edge.
        jobs = [(name, code) for name in args.configs.split(",")
                for code in (["example"] if name == "example" else
                             ["kit", "base"] if "base" in codes and CONFIGS[name][1]["--num-negs"] != "1" else ["kit"])]
        rows = []
        for run in range(args.runs):
            for name, code in jobs:
                command, settings = CONFIGS[name]
                figures = one_job(cluster, name, codes[code], command, settings, part_config, args.epochs,
                                  args.timeout)
                params = {"config": name, "code": revisions.get(code, "example"), "run": run,
                          "settings": settings or EXAMPLE_SETTINGS, "graph_nodes": args.nodes,
                          "degree": args.degree, "epochs": args.epochs, "workers": args.workers}
                rows.append(benchlib.report("linkpred", params, figures))
        print_table(rows)


def partition(cluster: clusterlib.Cluster, nodes: int, degree: float) -> str:
    """The synthetic graph with 5% + 5% of its node pairs held out (dgl_job's defaults for link prediction),
    partitioned for the cluster on node1 (no-ops when current)."""
    num_parts = len(cluster.workers())
    data = f"{clusterlib.WS}/datasets/bench-links-{nodes}-{degree}"
    out = f"{clusterlib.WS}/partitions/bench-links-{nodes}-{degree}-{num_parts}"
    python = clusterlib.VENV_PYTHON
    cluster.ssh(next(iter(cluster.workers())),
                f"{python} -m dglkit prepare --dataset synthetic --out {data} --num-nodes {nodes} --avg-degree {degree} "
                f"--feat-dim 100 --val-edges-frac 0.05 --test-edges-frac 0.05 && {python} -m dglkit partition "
                f"--dataset-dir {data} --out {out} --num-parts {num_parts} --graph-name links")
    return f"{out}/links.json"


def ship(cluster: clusterlib.Cluster, label: str, source) -> str:
    """A fresh copy of `source` (a program directory, or an app/ holding the dglkit package) on the cluster."""
    target = cluster.workspace / "bench-code" / label
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return f"{clusterlib.WS}/bench-code/{label}"


def ship_revision(cluster: clusterlib.Cluster, revision: str) -> str:
    target = cluster.workspace / "bench-code" / f"rev-{revision}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision, "app"], cwd=benchlib.REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(target)], input=archive.stdout, check=True)
    return f"{clusterlib.WS}/bench-code/rev-{revision}"


def one_job(cluster: clusterlib.Cluster, name: str, code: str, command: str, settings: dict, part_config: str,
            epochs: int, timeout: float) -> dict:
    example = name == "example"
    arguments = {**settings, ("--num_epochs" if example else "--num-epochs"): str(epochs)}
    launch = {"num_trainers": 1, "program_dir": code,
              "command": command + " ".join(f"{flag} {shlex.quote(value)}" for flag, value in arguments.items()),
              # The example reads DGL's example names; the servers rename the kit's as they load them.
              "node_data_names": {"feat": "features"} if example else {}}
    shm_before = clusterlib.shm_listing(cluster)
    job_dir = clusterlib.new_job_dir(cluster, f"lp-{name}")
    local_job = cluster.workspace / job_dir.removeprefix(clusterlib.WS + "/")
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    clusterlib.start_kit(cluster, job_dir, part_config, launch, [])
    try:
        total, _ = clusterlib.wait_all_exited(cluster, timeout)
        wall = round(time.perf_counter() - start, 2)
    finally:
        clusterlib.cleanup(cluster, shm_before)
    figures = example_figures(local_job) if example else kit_figures(local_job)
    return {"ok": total is not None and figures.pop("complete"), "job_wall_s": wall, **figures,
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def kit_figures(job: "os.PathLike") -> dict:
    """Per epoch from metrics.jsonl: training time (slowest trainer), edges/s (all trainers), evaluation time."""
    path = job / "metrics.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    epochs = [e for e in events if e["event"] == "epoch"]
    test = next((e for e in events if e["event"] == "test"), None)
    edges = [round(e["seeds_per_s"] * e["epoch_time"]) for e in epochs]
    return {"complete": test is not None, "epoch_time_s": [round(e["epoch_time"], 2) for e in epochs],
            "edges_per_s": [round(e["seeds_per_s"]) for e in epochs], "train_edges": edges[0] if edges else None,
            "eval_time_s": [round(e["eval_time"], 2) for e in epochs if "eval_time" in e],
            "metric": "test_mrr", "value": round(test["test_mrr"], 4) if test else None}


def example_figures(job: "os.PathLike") -> dict:
    """The example prints each trainer's epoch time and, on rank 0, its node counts and test accuracy."""
    logs = "\n".join(path.read_text(errors="replace") for path in sorted(job.glob("nodes/*/trainer-*.log")))
    times: dict[int, float] = {}
    for _rank, epoch, seconds in EPOCH_LINE.findall(logs):
        times[int(epoch)] = max(times.get(int(epoch), 0.0), float(seconds))
    edges = re.search(r"rank \d+: \d+ nodes, (\d+) edges", logs)
    accuracy = re.search(r"eval acc [0-9.]+; test acc ([0-9.]+)", logs)
    epoch_times = [round(times[e], 2) for e in sorted(times)]
    train_edges = int(edges.group(1)) if edges else None
    return {"complete": accuracy is not None, "epoch_time_s": epoch_times,
            "edges_per_s": [round(train_edges / t) for t in epoch_times] if train_edges else [],
            "train_edges": train_edges, "eval_time_s": [], "metric": "test_acc (logistic regression)",
            "value": float(accuracy.group(1)) if accuracy else None}


def print_work(nodes: int, degree: float, batches: int = 20) -> None:
    sys.path.insert(0, str(benchlib.REPO / "app"))
    import dgl
    import torch

    from dglkit.linkpred import PooledUniform

    with tempfile.TemporaryDirectory(prefix="dglkit-linkpred-") as tmp:
        subprocess.run([benchlib.PYTHON, "-m", "dglkit", "prepare", "--dataset", "synthetic", "--out", tmp,
                        "--num-nodes", str(nodes), "--avg-degree", str(degree), "--val-edges-frac", "0.05",
                        "--test-edges-frac", "0.05"], env=benchlib.APP_ENV, check=True, capture_output=True)
        g = dgl.load_graphs(f"{tmp}/graph.dgl")[0][0]
    torch.manual_seed(0)
    rows = []
    for batch in (1000, 256):
        for negs in (1, 5):
            for name, negatives in (("DGL Uniform", dgl.dataloading.negative_sampler.Uniform(negs)),
                                    ("kit pool", PooledUniform(negs))):
                sampler = dgl.dataloading.as_edge_prediction_sampler(dgl.dataloading.NeighborSampler([10, 25]),
                                                                     negative_sampler=negatives)
                eids = torch.randperm(g.num_edges())[:batch * batches]
                counts = torch.zeros(3)
                for input_nodes, _, _, blocks in dgl.dataloading.DataLoader(g, eids, sampler, batch_size=batch):
                    counts += torch.tensor([blocks[-1].num_dst_nodes(), len(input_nodes),
                                            sum(block.num_edges() for block in blocks)])
                rows.append([batch, negs, name, *(f"{x:.1f}" for x in (counts / len(eids)).tolist())])
    print(f"{nodes} nodes, {g.num_edges()} edges; fan-out 10,25; per training edge, over {batches} batches:")
    print(benchlib.table(["batch", "negs", "negatives", "seed nodes", "input nodes", "sampled edges"], rows))


def print_table(rows: list[dict]) -> None:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        p = row["params"]
        key = json.dumps([p["config"], p["code"], p["settings"], p["graph_nodes"], p["epochs"], p["workers"]])
        groups.setdefault(key, []).append(row)
    out = []
    for key, lines in groups.items():
        config, code, settings, nodes, epochs, workers = json.loads(key)
        f = [line["figures"] for line in lines]
        ok = [x for x in f if x["ok"]]
        loads = [x["load_before"] for x in f] + [x["load_after"] for x in f]
        sampling = f"{settings['--batch-size']} / {settings['--fan-out']} / {settings['--num-negs']}"
        out.append([config, code, sampling, settings["--num-hidden"], f"{nodes} / {ok[0]['train_edges'] if ok else '-'}",
                    f"{workers} x {epochs}", benchlib.spread([statistics.median(x["epoch_time_s"]) for x in ok]),
                    benchlib.spread([statistics.median(x["edges_per_s"]) for x in ok]),
                    benchlib.spread([statistics.median(x["eval_time_s"]) for x in ok if x["eval_time_s"]]),
                    f"{ok[0]['metric'] if ok else '-'} {benchlib.spread([x['value'] for x in ok])}",
                    f"{len(ok)}/{len(f)}", f"{min(loads):g}-{max(loads):g}"])
    print(benchlib.table(["config", "code", "batch / fan-out / negs", "hidden", "nodes / train edges",
                          "workers x epochs", "epoch s (train)", "train edges/s", "eval s per epoch", "eval metric",
                          "ok runs", "load 1m"], out))


if __name__ == "__main__":
    main()

"""Benchmark training throughput on a test cluster of 2 (or --workers) workers: seeds/s and epoch time with
GraphBolt on/off, 0 and 1 sampler per trainer, the kit's launcher with its defaults (and tuned variants) versus
DGL's plain launch.py contract started by hand, all on the same partitions. Appends to
bench/results/throughput.jsonl.

    .venv/bin/python bench/throughput.py --runs 2
    .venv/bin/python bench/throughput.py --quick
"""

import argparse
import json
import os
import statistics
import time

import benchlib
import clusterlib
from dglkit.common import read_json


def parse_variant(text: str) -> dict:
    """'trainer_threads=2' -> {"trainer_threads": 2}: a launch setting (job.json key) that differs from the kit's."""
    key, _, value = text.partition("=")
    return {key: int(value)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default="bench", help="test cluster name (started if needed)")
    parser.add_argument("--workers", type=int, default=2, help="workers (node1, the storage host, is one of them)")
    parser.add_argument("--nodes", type=int, default=200_000, help="synthetic graph size (average degree 25)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per job; the first is warm-up and not counted")
    parser.add_argument("--runs", type=int, default=2, help="jobs per configuration")
    parser.add_argument("--graphbolt", choices=("off", "on", "both"), default="both")
    parser.add_argument("--samplers", default="0,1", help="comma list of sampler processes per trainer")
    parser.add_argument("--launchers", default="kit,plain", help="comma list of kit, plain")
    parser.add_argument("--kit-variants", default="trainer_threads=2,num_servers=2",
                        help="comma list of kit settings tried one at a time (GraphBolt off, 0 samplers); '' for none")
    parser.add_argument("--timeout", type=float, default=900, help="longest a job may take")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running afterwards")
    benchlib.add_common_arguments(parser, "50k nodes, 2 epochs, one config per launcher")
    args = benchlib.parse(parser, "throughput", print_table)
    if args is None:
        return
    if args.quick:
        args.nodes, args.epochs, args.runs, args.graphbolt, args.samplers, args.kit_variants = \
            50_000, 2, 1, "off", "0", ""

    configs = []
    for graphbolt in {"off": [False], "on": [True], "both": [False, True]}[args.graphbolt]:
        for samplers in (int(s) for s in args.samplers.split(",")):
            for launcher in args.launchers.split(","):
                configs.append((launcher, graphbolt, {"num_samplers": samplers}))
    for variant in filter(None, args.kit_variants.split(",")):
        configs.append(("kit", False, {"num_samplers": 0, **parse_variant(variant)}))

    with clusterlib.session(args.cluster, args.workers, args.keep_cluster) as cluster:
        part_config = clusterlib.partition(cluster, args.nodes, 25)
        rows = []
        # Runs outermost: configurations alternate, so that a change in the shared machine's load hits all alike.
        for run in range(args.runs):
            for launcher, graphbolt, settings in configs:
                figures = one_job(cluster, launcher, graphbolt, settings, part_config, args.epochs, args.timeout)
                params = {"launcher": launcher, "graphbolt": graphbolt, "settings": settings, "run": run,
                          "graph_nodes": args.nodes, "epochs": args.epochs, "workers": args.workers}
                rows.append(benchlib.report("throughput", params, figures))
        print_table(rows)

def one_job(cluster: clusterlib.Cluster, launcher: str, graphbolt: bool, settings: dict, part_config: str,
            epochs: int, timeout: float) -> dict:
    train_args = ["--num-epochs", str(epochs), *(["--graphbolt"] if graphbolt else [])]
    shm_before = clusterlib.shm_listing(cluster)
    job_dir = clusterlib.new_job_dir(cluster, f"tp-{launcher}")
    local_job = cluster.workspace / job_dir.removeprefix(clusterlib.WS + "/")
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    if launcher == "kit":
        clusterlib.start_kit(cluster, job_dir, part_config, settings, train_args)
    else:
        plain = {"num_servers": 1, "num_trainers": 1, **settings}  # launch.py flags that the tutorial passes
        clusterlib.start_plain(cluster, job_dir, part_config, train_args, **plain)
    try:
        total, _ = clusterlib.wait_all_exited(cluster, timeout)
        wall = round(time.perf_counter() - start, 2)
        survivors = clusterlib.survivors(cluster) if total is None else {}
    finally:
        clusterlib.cleanup(cluster, shm_before)
    metrics = [json.loads(line) for line in (local_job / "metrics.jsonl").read_text().splitlines()] \
        if (local_job / "metrics.jsonl").is_file() else []
    epochs_seen = [m for m in metrics if m.get("event") == "epoch"]
    steady = epochs_seen[1:] or epochs_seen  # epoch 0 pays for connections and caches
    result = read_json(local_job / "result.json")
    return {"ok": result is not None and total is not None, "job_wall_s": wall, "survivors": survivors,
            "epoch_time_s": [round(m["epoch_time"], 3) for m in epochs_seen],
            "seeds_per_s": [round(m["seeds_per_s"]) for m in epochs_seen],
            "steady_epoch_time_s": round(statistics.median(m["epoch_time"] for m in steady), 3) if steady else None,
            "steady_seeds_per_s": round(statistics.median(m["seeds_per_s"] for m in steady)) if steady else None,
            "test_acc": round(result["test_acc"], 4) if result else None, "failed_file": read_json(local_job / "FAILED"),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def print_table(rows: list[dict]) -> None:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        p = row["params"]
        key = json.dumps([p["launcher"], p["graphbolt"], p["settings"], p["epochs"], p["workers"]])
        groups.setdefault(key, []).append(row)
    out = []
    for key, lines in groups.items():
        launcher, graphbolt, settings, epochs, workers = json.loads(key)
        f = [line["figures"] for line in lines]
        ok = [x for x in f if x["ok"]]
        extra = ", ".join(f"{k}={v}" for k, v in settings.items() if k != "num_samplers") or "defaults"
        loads = [x["load_before"] for x in f] + [x["load_after"] for x in f]
        out.append([launcher if launcher == "plain" else f"kit ({extra})", "on" if graphbolt else "off",
                    settings["num_samplers"], workers, epochs, benchlib.spread([x["steady_seeds_per_s"] for x in ok]),
                    benchlib.spread([x["steady_epoch_time_s"] for x in ok]), benchlib.spread([x["job_wall_s"] for x in ok]),
                    benchlib.spread([x["test_acc"] for x in ok]), f"{len(ok)}/{len(f)}", f"{min(loads):g}-{max(loads):g}"])
    print(benchlib.table(["launcher", "GraphBolt", "samplers/trainer", "workers", "epochs", "seeds/s", "epoch s",
                          "job wall s", "test acc", "ok runs", "load 1m"], out))


if __name__ == "__main__":
    main()

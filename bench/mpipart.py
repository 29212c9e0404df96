"""Benchmark the distributed partitioner (dglkit.mpiassign, then dglkit.mpibuild, under mpirun on this host's
loopback) against the lean single-host builder (`dglkit partition --builder lean`) on synthetic graphs of
growing size: wall time, peak RSS of each rank and of the lean process, bytes per edge of a rank's share
(peak RSS over what importing DGL takes, / (edges / ranks)) and the edge cut of each. Appends to bench/results/mpipart.jsonl.

    .venv/bin/python bench/mpipart.py --sizes 100k,300k --ranks 2,4
    .venv/bin/python bench/mpipart.py --sizes 300k,1M --ranks 2 --directed
    .venv/bin/python bench/mpipart.py --quick

--directed keeps one direction of each of the synthetic graph's edges (src < dst), as a citation graph such as
ogbn-papers100M lists its edges: half the edges, each of which the assignment still takes in both directions.

Ranks = parts. On this host the ranks share its cores: wall times say what the exchange costs, not what W hosts
would take. A rank's peak includes the ~0.4 GB of importing DGL and torch (mpibuild writes DGL's files).
"""

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

import benchlib

SIZES = {"20k": 20_000, "100k": 100_000, "300k": 300_000, "1M": 1_000_000, "3M": 3_000_000}
MPIRUN = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]


def mpi(python: str, ranks: int, program: str, *args: object) -> dict[str, Any]:
    env = {**benchlib.APP_ENV, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return benchlib.measure([*MPIRUN, "-np", str(ranks), python, "-m", f"dglkit.{program}", *map(str, args)], env=env)


def baseline_mb(python: str) -> int:
    """Peak RSS of a process that only imports what a rank imports: subtracted for the marginal bytes per edge."""
    run = benchlib.measure([python, "-c", "import dgl, mpi4py.MPI, dglkit.mpibuild, dglkit.ptscotch"])
    assert run["returncode"] == 0, run["stderr_tail"]
    return int(run["peak_rss_mb"])


def per_edge(peak_mb: float, base_mb: float, edges: float) -> float:
    return round((peak_mb - base_mb) * 2**20 / edges, 1)


def prepare(args: argparse.Namespace, size: str) -> Path:
    """The synthetic graph's dataset with its arrays (with --directed, the graph of one direction per edge)."""
    data = args.workdir / f"data-{size}"
    if not (data / "dataset.json").is_file():
        run = benchlib.measure([benchlib.PYTHON, "-m", "dglkit", "prepare", "--dataset", "synthetic", "--out",
                                str(data), "--num-nodes", str(SIZES[size]), "--avg-degree", "25", "--feat-dim",
                                str(args.feat_dim), "--arrays", "--memory-gb", "0"])
        assert run["returncode"] == 0, run["stderr_tail"]
    if not args.directed:
        return data
    directed = args.workdir / f"data-{size}-directed"
    if not (directed / "dataset.json").is_file():
        arrays = data / "arrays"
        src, dst = (np.load(arrays / f"{end}.npy") for end in ("src", "dst"))
        files = directed.with_name(directed.name + "-files")
        files.mkdir(parents=True, exist_ok=True)
        np.save(files / "edges.npy", np.stack([src[src < dst], dst[src < dst]], axis=1))
        for name in ("feat", "labels", "train_mask", "val_mask", "test_mask"):
            np.save(files / f"{name}.npy", np.load(arrays / f"node_{name}.npy"))
        run = benchlib.measure([benchlib.PYTHON, "-m", "dglkit", "prepare", "--dataset", "files", "--path", str(files),
                                "--out", str(directed), "--arrays", "--memory-gb", "0"])
        assert run["returncode"] == 0, run["stderr_tail"]
        shutil.rmtree(files)
    return directed


def run_size(args: argparse.Namespace, size: str, ranks: int, base: int) -> dict[str, Any]:
    data, work = prepare(args, size), args.workdir / f"{size}-{ranks}"
    num_edges = json.loads((data / "dataset.json").read_text())["num_edges"]
    shutil.rmtree(work, ignore_errors=True)
    lean = benchlib.measure([benchlib.PYTHON, "-m", "dglkit", "partition", "--dataset-dir", str(data), "--out",
                             str(work / "lean"), "--num-parts", str(ranks), "--builder", "lean", "--memory-gb", "0"])
    batch = ("--batch-edges", args.batch_edges) if args.batch_edges else ()
    assign = mpi(args.python, ranks, "mpiassign", "--dataset-dir", data, "--out", work / "assignment",
                 "--num-parts", ranks, *batch)
    build = mpi(args.python, ranks, "mpibuild", "--dataset-dir", data, "--assignment", work / "assignment",
                "--out", work / "parts", *batch)
    for name, run in (("lean", lean), ("mpiassign", assign), ("mpibuild", build)):
        assert run["returncode"] == 0, (name, run["stderr_tail"])
    manifests = {name: json.loads((work / name / "manifest.json").read_text())
                 for name in ("lean", "assignment", "parts")}
    share = num_edges / ranks
    assign_peaks = [r["peak_rss_mb"] for r in manifests["assignment"]["ranks"]]
    build_peaks = [p["peak_rss_mb"] for p in manifests["parts"]["parts"]]
    shutil.rmtree(work, ignore_errors=True)
    return {
        "num_edges": num_edges, "import_baseline_mb": base,
        "lean": {"wall_s": lean["wall_s"], "peak_rss_mb": lean["tree_peak_rss_mb"],
                 "bytes_per_edge_over_baseline": per_edge(lean["tree_peak_rss_mb"], base, num_edges),
                 "edge_cut_fraction": manifests["lean"]["edge_cut"]["fraction"]},
        "mpi": {"assign_wall_s": assign["wall_s"], "build_wall_s": build["wall_s"],
                "assign_rank_peak_rss_mb": assign_peaks,
                "assign_rank_shuffle_peak_rss_mb": [r["shuffle_peak_rss_mb"] for r in manifests["assignment"]["ranks"]],
                "build_rank_peak_rss_mb": build_peaks,
                "assign_bytes_per_share_edge": round(max(assign_peaks) * 2**20 / share, 1),
                "build_bytes_per_share_edge_over_baseline": per_edge(max(build_peaks), base, share),
                "edge_cut_fraction": manifests["parts"]["edge_cut"]["fraction"],
                "pair_cut_fraction": manifests["assignment"]["edge_cut"]["fraction"],
                "parts": [{key: p[key] for key in ("nodes", "edges", "train_nodes")}
                          for p in manifests["parts"]["parts"]]}}


def table_row(record: dict) -> list:
    params, lean, mpi = record["params"], record["figures"]["lean"], record["figures"]["mpi"]
    shuffle = mpi.get("assign_rank_shuffle_peak_rss_mb")
    return [params["size"], params["ranks"], params.get("batch_edges") or "4M", record["figures"]["num_edges"],
            lean["wall_s"], lean["peak_rss_mb"], lean["bytes_per_edge_over_baseline"],
            round(mpi["assign_wall_s"] + mpi["build_wall_s"], 2), max(shuffle) if shuffle else "-",
            max(mpi["assign_rank_peak_rss_mb"]), max(mpi["build_rank_peak_rss_mb"]),
            mpi["build_bytes_per_share_edge_over_baseline"], lean["edge_cut_fraction"], mpi["edge_cut_fraction"]]


def print_table(records: list[dict]) -> None:
    print(benchlib.table(["size", "ranks", "batch", "edges", "lean s", "lean MB", "lean B/edge*", "mpi s",
                          "assign MB/rank before PT-Scotch", "assign MB/rank", "build MB/rank", "build B/share edge*",
                          "lean cut", "mpi cut"], [table_row(r) for r in records]))
    print("* over the baseline of importing DGL (import_baseline_mb)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100k,300k", help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument("--ranks", default="2,4", help="comma list of rank (= part) counts")
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--batch-edges", type=int, help="the programs' --batch-edges (default: theirs)")
    parser.add_argument("--python", default=benchlib.PYTHON, help="the ranks' Python (with mpi4py)")
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/dglkit-bench/mpipart"))
    parser.add_argument("--directed", action="store_true", help="one direction of each edge (module docstring)")
    benchlib.add_common_arguments(parser, "20k nodes, 2 ranks")
    args = benchlib.parse(parser, "mpipart", print_table)
    if args is None:
        return
    sizes, ranks = args.sizes.split(","), [int(r) for r in args.ranks.split(",")]
    if args.quick:
        sizes, ranks = ["20k"], [2]
    os.makedirs(args.workdir, exist_ok=True)
    base = baseline_mb(args.python)
    for size in sizes:
        for count in ranks:
            benchlib.report("mpipart", {"size": size, "nodes": SIZES[size], "ranks": count, "feat_dim": args.feat_dim,
                                        "batch_edges": args.batch_edges, "directed": args.directed},
                            run_size(args, size, count, base))


if __name__ == "__main__":
    main()

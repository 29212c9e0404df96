"""Memory of writing and of checking one chunk of a synthetic graph in DGL's chunked format (`dglkit chunked
generate --chunks 0`, then `dglkit chunked check --chunks 0`), each in a process of its own: peak RSS (the
kernel's ru_maxrss), wall and CPU seconds, the chunk's bytes on disk. The claim measured: a chunk's memory
follows the chunk's size, not the graph's, so that hosts writing their own chunks never hold the graph.
Appends to bench/results/chunked_generate.jsonl.

    .venv/bin/python bench/chunked_generate.py                      # the grid below
    .venv/bin/python bench/chunked_generate.py --quick              # small graphs only
    .venv/bin/python bench/chunked_generate.py --table

Grid: chunks of 250k nodes in graphs of 1M, 4M and 16M nodes (memory flat as the graph grows), and graphs of
4M nodes in chunks of 125k to 1M nodes (memory in proportion to the chunk). Degree 20, 100 features, 10
classes; only chunk 0 is written, under --work (removed afterwards).
"""

import argparse
import shutil
import subprocess
from pathlib import Path

import benchlib

# (nodes, chunks, whether to write the other chunks too and measure checking chunk 0)
FULL = [(1_000_000, 4, True), (4_000_000, 16, False), (16_000_000, 64, False), (4_000_000, 32, False),
        (4_000_000, 8, False), (4_000_000, 4, False)]
QUICK = [(100_000, 4, True), (400_000, 16, False)]
PARAMS = ["--avg-degree", "20", "--feat-dim", "100", "--num-classes", "10", "--seed", "0"]


def run_one(work: Path, nodes: int, chunks: int, check: bool, dataset: str) -> None:
    out = work / f"{dataset}-{nodes}-{chunks}"
    shutil.rmtree(out, ignore_errors=True)
    base = [benchlib.PYTHON, "-m", "dglkit", "chunked"]
    generate = [*base, "generate", "--out", str(out), "--dataset", dataset, "--num-nodes", str(nodes),
                "--num-chunks", str(chunks), *PARAMS]
    figures = {"write": benchlib.measure([*generate, "--chunks", "0"], limit_mb=6000)}
    if figures["write"]["returncode"] == 0:
        figures["chunk_mb"] = round(sum(p.stat().st_size for p in out.rglob("*-0.*")) / 2**20, 1)
    if check and figures["write"]["returncode"] == 0:
        # Checking needs metadata.json, which needs every chunk: the others are written unmeasured.
        subprocess.run(generate, env=benchlib.APP_ENV, check=True, capture_output=True)
        figures["check"] = benchlib.measure([*base, "check", "--path", str(out), "--chunks", "0"], limit_mb=6000)
    shutil.rmtree(out, ignore_errors=True)
    benchlib.report("chunked_generate", {"dataset": dataset, "num_nodes": nodes, "num_chunks": chunks,
                                         "chunk_nodes": nodes // chunks}, figures)


def print_table(records: list[dict]) -> None:
    rows = []
    for r in records:
        p, f = r["params"], r["figures"]
        check = f.get("check") or {}
        rows.append([p["dataset"], p["num_nodes"], p["num_chunks"], p["chunk_nodes"], f.get("chunk_mb", "-"),
                     f["write"]["peak_rss_mb"], f["write"]["wall_s"], f["write"]["cpu_s"],
                     check.get("peak_rss_mb", "-")])
    print(benchlib.table(["dataset", "nodes", "chunks", "nodes/chunk", "chunk on disk MB", "write peak RSS MB",
                          "write wall s", "write CPU s", "check peak RSS MB"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchlib.add_common_arguments(parser, "graphs of 100k and 400k nodes")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/dglkit-bench/chunked"))
    parser.add_argument("--dataset", choices=("synthetic", "synthetic-hetero"), default="synthetic")
    args = benchlib.parse(parser, "chunked_generate", print_table)
    if args is None:
        return
    args.work.mkdir(parents=True, exist_ok=True)
    for nodes, chunks, check in QUICK if args.quick else FULL:
        run_one(args.work, nodes, chunks, check, args.dataset)


if __name__ == "__main__":
    main()

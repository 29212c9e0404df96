"""Benchmark `dglkit prepare` + `dglkit partition`: wall time, peak RSS and edge cut for synthetic graphs of
growing size, 2 and 4 parts, with and without GraphBolt. Appends to bench/results/partition.jsonl.

    .venv/bin/python bench/partition.py --sizes 100k,1M --runs 3
    .venv/bin/python bench/partition.py --sizes products,products-dgl --parts 2 --graphbolt on --runs 1
    .venv/bin/python bench/partition.py --sizes products-dgl --parts 2,4 --builders lean --reuse-data
    .venv/bin/python bench/partition.py --quick
"""

import argparse
import itertools
import json
import shutil
from pathlib import Path

import benchlib

# Nodes and the generator's --avg-degree, which counts edges before self loops and duplicate pairs are dropped
# (4-7% of them). "products": ogbn-products' 2,449,029 nodes and 61.86M edges (its 61,859,140). "products-dgl":
# the same graph as DGL loads ogbn-products, every edge in both directions: 123.7M edges.
SIZES = {"100k": (100_000, 25), "1M": (1_000_000, 25), "2M": (2_000_000, 25), "products": (2_449_029, 26.41),
         "products-dgl": (2_449_029, 54.37)}


def parse_sizes(text: str) -> list[str]:
    sizes = text.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sizes {unknown}; choose from {', '.join(SIZES)}")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, default=["100k", "1M"], help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument("--parts", default="2,4", help="comma list of partition counts")
    parser.add_argument("--graphbolt", choices=("off", "on", "both"), default="both")
    parser.add_argument("--builders", default="lean", help="comma list of `dglkit partition --builder` values")
    parser.add_argument("--reuse-data", action="store_true",
                        help="partition the dataset an earlier run prepared in --workdir, and keep it")
    parser.add_argument("--runs", type=int, default=3, help="runs of each configuration (medians are reported)")
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/dglkit-bench/partition"))
    parser.add_argument("--limit-gb", type=float, default=21,
                        help="kill a run whose processes hold more memory than this (the machine is shared)")
    benchlib.add_common_arguments(parser, "20k nodes, 2 parts, one run each")
    args = benchlib.parse(parser, "partition", print_table)
    if args is None:
        return
    parts = [int(p) for p in args.parts.split(",")]
    graphbolt = {"off": [False], "on": [True], "both": [False, True]}[args.graphbolt]
    if args.quick:
        SIZES["20k"] = (20_000, 25)
        args.sizes, parts, args.runs = ["20k"], [2], 1
    rows: list[dict] = []
    for size in args.sizes:
        nodes, degree = SIZES[size]
        data = args.workdir / f"data-{size}"
        prepare = [benchlib.PYTHON, "-m", "dglkit", "prepare", "--dataset", "synthetic", "--out", str(data),
                   "--num-nodes", str(nodes), "--avg-degree", str(degree), "--feat-dim", str(args.feat_dim)]
        for run in range(0 if args.reuse_data and (data / "dataset.json").is_file() else args.runs):
            shutil.rmtree(data, ignore_errors=True)  # prepare is a no-op on an existing dataset
            m = benchlib.measure(prepare, limit_mb=args.limit_gb * 1024)
            record(rows, size, "prepare", None, None, run, m, prepare)
            if m["returncode"]:
                break
        if not (data / "dataset.json").is_file():
            continue
        for num_parts, gb, builder in itertools.product(parts, graphbolt, args.builders.split(",")):
            out = args.workdir / f"part-{size}-{num_parts}"
            cmd = [benchlib.PYTHON, "-m", "dglkit", "partition", "--dataset-dir", str(data), "--out", str(out),
                   "--num-parts", str(num_parts), "--graph-name", "bench", "--builder", builder,
                   *(["--graphbolt"] if gb else [])]
            for run in range(args.runs):
                shutil.rmtree(out, ignore_errors=True)
                m = benchlib.measure(cmd, limit_mb=args.limit_gb * 1024)
                manifest = json.loads((out / "manifest.json").read_text()) if m["returncode"] == 0 else None
                record(rows, size, "partition", num_parts, gb, run, m, cmd, manifest, builder)
            shutil.rmtree(out, ignore_errors=True)
        if not args.reuse_data:
            shutil.rmtree(data, ignore_errors=True)
    print_table(rows)


def record(rows: list, size: str, stage: str, num_parts: int | None, graphbolt: bool | None, run: int,
           m: dict, cmd: list[str], manifest: dict | None = None, builder: str | None = None) -> None:
    figures = {"wall_s": m["wall_s"], "cpu_s": m["cpu_s"], "peak_rss_mb": m["peak_rss_mb"],
               "tree_peak_rss_mb": m["tree_peak_rss_mb"],
               "returncode": m["returncode"], "over_limit": m["over_limit"],
               "load_before": m["load_before"], "load_after": m["load_after"]}
    if m["returncode"]:
        figures["error"] = m["stderr_tail"]
    result = m["result"] or {}
    if stage == "prepare":
        figures.update(num_nodes=result.get("num_nodes"), num_edges=result.get("num_edges"))
    if manifest:
        figures.update(timings=manifest["timings"], manifest_peak_rss_mb=manifest["peak_rss_mb"],
                       edge_cut=manifest["edge_cut"]["fraction"], num_nodes=manifest["num_nodes"],
                       num_edges=manifest["num_edges"], part_nodes=[p["nodes"] for p in manifest["parts"]],
                       builders=manifest.get("builders"))
    params = {"size": size, "stage": stage, "num_parts": num_parts, "graphbolt": graphbolt, "run": run,
              "argv": cmd[1:], "builder": builder}
    line = benchlib.append("partition", {"params": params, "figures": figures})
    rows.append(line)
    state = "ok" if not m["returncode"] else ("KILLED over memory limit" if m["over_limit"] else "FAILED")
    print(f"{size} {stage} {builder or ''} parts={num_parts} graphbolt={graphbolt} run {run}: {m['wall_s']} s, "
          f"peak RSS {m['peak_rss_mb']} MB, load {m['load_before']}->{m['load_after']} {state}", flush=True)


def print_table(rows: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        p = row["params"]
        # Rows from before the lean builder existed are partition_graph's.
        builder = p.get("builder") or ("dgl" if p["stage"] == "partition" else "-")
        at_once = row["figures"].get("builders") or 1  # parts the lean builder built at once
        builder += f" ({at_once} at once)" if at_once > 1 else ""
        groups.setdefault((p["size"], p["stage"], builder, p["num_parts"], p["graphbolt"]), []).append(row)
    out = []
    for (size, stage, builder, num_parts, gb), lines in groups.items():
        f = [line["figures"] for line in lines]
        ok = [x for x in f if x["returncode"] == 0]
        edges = next((x.get("num_edges") for x in ok if x.get("num_edges")), "-")
        if stage == "prepare":
            out.append([size, edges, "prepare", "-", "-", "-", benchlib.spread([x["wall_s"] for x in ok]),
                        benchlib.spread([x.get("cpu_s") for x in ok]), "-", "-",
                        "-", benchlib.spread([x["peak_rss_mb"] for x in ok]), "-", "-", busy(f)])
            continue
        t = [x.get("timings", {}) for x in ok]
        out.append([size, edges, "partition", builder, num_parts, "on" if gb else "off",
                    benchlib.spread([x["wall_s"] for x in ok]), benchlib.spread([x.get("cpu_s") for x in ok]),
                    benchlib.spread([x.get("partition_s", x.get("assign_s")) for x in t]),
                    benchlib.spread([x.get("build_s") for x in t]),
                    benchlib.spread([x.get("graphbolt_s") for x in t]) if gb else "-",
                    benchlib.spread([x["peak_rss_mb"] for x in ok]),
                    benchlib.spread([x["tree_peak_rss_mb"] for x in ok]),
                    benchlib.spread([x["edge_cut"] for x in ok]), busy(f)])
    print(benchlib.table(["graph", "edges", "stage", "builder", "parts", "GraphBolt", "wall s", "CPU s",
                          "partition_graph / METIS s", "build s", "GraphBolt conversion s", "peak RSS MB",
                          "tree peak MB", "edge cut", "load 1m"], out))


def busy(figures: list[dict]) -> str:
    """Load range during the runs: above the 2 cores means colleagues' jobs shared the machine."""
    loads = [x["load_before"] for x in figures] + [x["load_after"] for x in figures]
    return f"{min(loads):g}-{max(loads):g}"


if __name__ == "__main__":
    main()

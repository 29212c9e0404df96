"""`dglkit partition`: split a prepared graph into one partition per machine with DGL's partition_graph,
the kit's lean builder (dglkit.leanpart) on one host, or the same builder spread over the workers.

Writes DGL's files (<graph name>.json, part<i>/), the ID mappings DGL returns but does not save
(orig_nids.npy, orig_eids.npy: new ID -> original ID; per type for heterogeneous graphs, see dglkit.hetero)
and manifest.json (dataset fingerprint, parameters, timings, peak RSS, edge cut, per-part counts). A re-run
with the same inputs is a no-op; --graphbolt on a current DGL-format partition only converts it.
"""

import argparse
import json
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from dglkit.common import UserError, emit_result, peak_rss_mb, read_json, write_json
from dglkit.progress import PROGRESS
from dglkit.resources import GB, MEMORY_HELP, check_fits, lean_builders, memory_estimate

DISTRIBUTED_STEPS = ("assign", "part", "finish")
ASSIGNMENT = "assignment.npy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset-dir", required=True, type=Path, help="output directory of `dglkit prepare`")
    parser.add_argument("--out", required=True, type=Path, help="partition directory (replaced when stale)")
    parser.add_argument("--num-parts", required=True, type=int, help="number of partitions = machines")
    parser.add_argument("--graph-name", default="graph", help="DistGraph name; the config is <name>.json (%(default)s)")
    parser.add_argument("--part-method", choices=("metis", "random"), default="metis", help="(%(default)s)")
    parser.add_argument("--num-hops", type=int, default=1, help="hops of halo nodes kept with each partition (%(default)s)")
    parser.add_argument("--no-balance-train", dest="balance_train", action="store_false",
                        help="do not ask METIS for an equal number of training nodes per partition")
    parser.add_argument("--no-balance-edges", dest="balance_edges", action="store_false",
                        help="do not ask METIS for an equal number of edges per partition")
    parser.add_argument("--graphbolt", action="store_true",
                        help="also write GraphBolt's fused_csc_sampling_graph.pt (for use_graphbolt=True)")
    parser.add_argument("--builder", choices=("lean", "dgl", "distributed"), default="lean",
                        help="lean: METIS in a child process, then one part at a time (a fraction of the memory; "
                             "1 hop); dgl: dgl.distributed.partition_graph; distributed: lean's output, built in "
                             "--step's from the dataset's arrays/ (prepare --arrays) so that no host holds the "
                             "whole graph with its features (%(default)s)")
    parser.add_argument("--step", choices=DISTRIBUTED_STEPS,
                        help="--builder distributed: assign (one host: METIS on the structure alone), part (on "
                             "each worker, with --part: that part's files), finish (one host, after every part: "
                             "ID mappings and the partition config)")
    parser.add_argument("--part", type=int, help="--step part: the part to build (0 .. num-parts - 1)")
    parser.add_argument("--memory-gb", type=float, help=MEMORY_HELP)


def run(args: argparse.Namespace) -> int:
    dataset = read_json(args.dataset_dir / "dataset.json")
    graph_file = args.dataset_dir / "graph.dgl"
    if dataset and dataset.get("format") == "chunked":
        raise UserError(f"{args.dataset_dir} describes a graph in DGL's chunked format ({dataset.get('path')}), which "
                        "the single-host builders do not read chunk by chunk: prepare it with --whole (graph.dgl) "
                        "where it fits one host, or partition it with the mpi builder (`dglkit mpi`)")
    if dataset is None or "fingerprint" not in dataset or not graph_file.is_file():
        raise UserError(f"{args.dataset_dir} is not a prepared dataset (dataset.json and graph.dgl); "
                        f"run `dglkit prepare --out {args.dataset_dir}` first")
    check_arguments(args, dataset)
    out: Path = args.out
    params = {key: getattr(args, key) for key in (
        "num_parts", "graph_name", "part_method", "num_hops", "balance_train", "balance_edges", "builder")}
    manifest_path, part_config = out / "manifest.json", out / f"{args.graph_name}.json"
    old = read_json(manifest_path) or {}
    current = (old.get("complete") and old.get("dataset_fingerprint") == dataset["fingerprint"]
               and old.get("parameters") == params and part_config.is_file()
               and all((out / f"part{i}").is_dir() for i in range(args.num_parts)))
    if current and (old["graphbolt"] or not args.graphbolt or args.step in ("assign", "part")):
        emit_result({"changed": False, **summary(old, out)})
        return 0
    if current:
        old["timings"]["graphbolt_s"] = to_graphbolt(part_config)
        old["graphbolt"] = True
        write_json(manifest_path, old)
        emit_result({"changed": True, "converted": True, **summary(old, out)})
        return 0
    if args.step in ("part", "finish"):
        return distributed_step(args, dataset, out, old, params)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not old)):
        raise UserError(f"--out {out} holds something that is not a dglkit partition; give a new or empty directory")

    what = f"partitioning {dataset['num_nodes']} nodes and {dataset['num_edges']} edges"
    sizes = dataset["num_nodes"], dataset["num_edges"], dataset["feat_dim"]
    storage_gb, worker_gb = (memory_estimate(stage, *sizes, args.num_parts) / GB for stage in ("assign", "part"))
    spread = (f"build the parts on the workers: --builder distributed (Ansible: dgl_job_partition_builder: "
              f"distributed), about {storage_gb:.1f} GB here and {worker_gb:.1f} GB on each worker")
    stage = "assign" if args.builder == "distributed" else args.builder
    builders = lean_builders(*sizes, args.num_parts, args.memory_gb) if args.builder == "lean" else 1
    estimates = check_fits(
        f"{what} (--builder {args.builder}{' --step assign' if args.step else ''})",
        memory_estimate(stage, *sizes, args.num_parts, builders),
        dataset["graph_bytes"] * (3 if args.graphbolt else 2), out, args.memory_gb, ways_out=(
            "partition on a storage host with more memory (the inventory's storage group), "
            + ("use --builder lean (a fraction of partition_graph's memory), " if args.builder == "dgl" else "")
            + (f"{spread}, " if args.builder != "distributed" and not dataset.get("heterogeneous") else "")
            + "or, for graphs no single host holds, DGL's distributed partitioning pipeline (ParMETIS)"))
    # The old partition is stale: remove it first so that no part<i> of a larger num_parts remains.
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    manifest = {"complete": False, "dataset_dir": str(args.dataset_dir.resolve()),
                "dataset_fingerprint": dataset["fingerprint"], "parameters": params, "graphbolt": False,
                "part_config": part_config.name, "num_parts": args.num_parts, "builders": builders, **estimates}
    write_json(manifest_path, manifest)  # marks the directory as ours, incomplete until the end
    timings: dict[str, float] = {}
    if args.builder == "distributed":
        distributed_assign(args, dataset, out, manifest, timings)
        return 0
    if args.builder == "lean":
        lean_partition(args, graph_file, out, manifest, timings, builders)
    else:
        dgl_partition(args, graph_file, out, part_config, manifest, timings)
    if args.graphbolt:
        timings["graphbolt_s"] = to_graphbolt(part_config)
    manifest.update(complete=True, graphbolt=args.graphbolt, timings=timings, peak_rss_mb=round(peak_rss_mb()))
    write_json(manifest_path, manifest)
    emit_result({"changed": True, **summary(manifest, out)})
    return 0


def check_arguments(args: argparse.Namespace, dataset: dict[str, Any]) -> None:
    if not 1 <= args.num_parts <= dataset["num_nodes"]:
        raise UserError(f"--num-parts must be between 1 and the {dataset['num_nodes']} nodes, got {args.num_parts}")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", args.graph_name):
        raise UserError(f"--graph-name {args.graph_name!r}: use letters, digits, '_' and '-' only")
    if args.num_hops < 1:
        raise UserError(f"--num-hops must be >= 1, got {args.num_hops}")
    if (args.builder == "distributed") != (args.step is not None):
        raise UserError("--builder distributed runs in --step's (assign, part on every worker, finish); "
                        "--step goes with --builder distributed only")
    if args.step == "part" and not (args.part is not None and 0 <= args.part < args.num_parts):
        raise UserError(f"--step part needs --part between 0 and {args.num_parts - 1}, got {args.part}")
    if args.builder == "distributed" and "arrays" not in dataset:
        raise UserError(f"--builder distributed reads {args.dataset_dir}/arrays/: prepare the dataset with --arrays")
    if dataset.get("heterogeneous"):
        args.builder = "dgl"  # the lean builder writes homogeneous partitions only
    if args.builder != "dgl" and args.num_hops != 1:
        raise UserError(f"--num-hops {args.num_hops}: the {args.builder} builder keeps 1 hop; use --builder dgl "
                        "for more")


def lean_partition(args: argparse.Namespace, graph_file: Path, out: Path, manifest: dict[str, Any],
                   timings: dict[str, float], builders: int) -> None:
    from dglkit import leanpart

    start = time.perf_counter()
    PROGRESS.phase(f"assign nodes to parts ({args.part_method})")
    leanpart.assign_in_child(graph_file, out / ASSIGNMENT, args.num_parts, args.part_method,
                             args.balance_train, args.balance_edges)
    timings["assign_s"] = lap(start)
    start = time.perf_counter()
    manifest.update(leanpart.build(graph_file, np.load(out / ASSIGNMENT), out, args.graph_name,
                                   args.num_parts, args.part_method, builders))
    (out / ASSIGNMENT).unlink()
    timings["build_s"] = lap(start)


def dataset_array(dataset_dir: Path, dataset: dict[str, Any], name: str) -> np.ndarray:
    """A memory map of one of the dataset's arrays/: only what is read of it is in memory."""
    return np.load(dataset_dir / dataset["arrays"]["dir"] / f"{name}.npy", mmap_mode="r")


def read_rows(path: Path, rows: np.ndarray, block_bytes: int = 64 * 2**20) -> np.ndarray:
    """Rows `rows` (sorted) of an .npy array, read a block at a time: only they and one block are in this
    process's memory (a memory map would map in nearly every page of the file, its neighbours' rows too)."""
    header = np.load(path, mmap_mode="r")
    row_shape, dtype, offset = header.shape[1:], header.dtype, header.offset
    row_items = int(np.prod(row_shape, dtype=np.int64))
    del header
    out = np.empty((len(rows), *row_shape), dtype)
    per_block = max(block_bytes // max(row_items * dtype.itemsize, 1), 1)
    with open(path, "rb") as f:
        done = 0
        while done < len(rows):
            first = rows[done]
            count = int(np.searchsorted(rows, first + per_block, side="left")) - done
            last = rows[done + count - 1]
            f.seek(offset + int(first) * row_items * dtype.itemsize)
            block = np.fromfile(f, dtype, count=(int(last - first) + 1) * row_items).reshape(-1, *row_shape)
            out[done:done + count] = block[rows[done:done + count] - first]
            done += count
    return out


def distributed_assign(args: argparse.Namespace, dataset: dict[str, Any], out: Path, manifest: dict[str, Any],
                       timings: dict[str, float]) -> None:
    """--step assign: the METIS assignment from the structure (and training mask) alone."""
    from dglkit import leanpart

    start = time.perf_counter()
    PROGRESS.phase(f"assign nodes to parts ({args.part_method})")
    if args.part_method == "metis" and args.num_parts > 1:
        train = (np.asarray(dataset_array(args.dataset_dir, dataset, "node_train_mask")).astype(bool)
                 if args.balance_train else None)
        assignment = leanpart.metis_parts([dataset_array(args.dataset_dir, dataset, name) for name in ("src", "dst")],
                                          dataset["num_nodes"], train, args.num_parts, args.balance_edges)
    else:
        assignment = leanpart.random_parts(dataset["num_nodes"], args.num_parts)
    np.save(out / ASSIGNMENT, assignment.astype(np.int32))
    timings["assign_s"] = lap(start)
    manifest.update(timings=timings, peak_rss_mb=round(peak_rss_mb()))
    write_json(out / "manifest.json", manifest)
    emit_result({"changed": True, "out": str(out), "step": "assign", "peak_rss_mb": manifest["peak_rss_mb"]})


def distributed_step(args: argparse.Namespace, dataset: dict[str, Any], out: Path, manifest: dict[str, Any],
                     params: dict[str, Any]) -> int:
    """--step part (one part, on the worker that runs it) and --step finish, after --step assign."""
    from dglkit import leanpart

    if (manifest.get("dataset_fingerprint") != dataset["fingerprint"]
            or manifest.get("parameters") != params or not (out / ASSIGNMENT).is_file()):
        raise UserError(f"{out} holds no assignment for these settings: run --step assign first")
    sizes = dataset["num_nodes"], dataset["num_edges"], dataset["feat_dim"], args.num_parts
    start = time.perf_counter()
    src, dst = (dataset_array(args.dataset_dir, dataset, name) for name in ("src", "dst"))
    if args.step == "part":
        check_fits(f"building part {args.part} of {args.num_parts} (--builder distributed --step part)",
                   memory_estimate("part", *sizes), dataset["graph_bytes"] * 2 // args.num_parts, out,
                   args.memory_gb, ways_out="workers with more memory, or more of them (more, smaller parts)")
        shutil.rmtree(out / f"part{args.part}", ignore_errors=True)  # an earlier attempt's
        arrays = args.dataset_dir / dataset["arrays"]["dir"]
        # The part in each phase: the workers' lines come one after another, without their host.
        PROGRESS.phase(f"part {args.part} of {args.num_parts}: lay out the assignment")
        layout = leanpart.Layout.of(np.load(out / ASSIGNMENT), dst, args.num_parts)
        PROGRESS.phase(f"part {args.part} of {args.num_parts}: read its node data, write its files")
        counts: dict[str, Any] = leanpart.build_part(out, args.part, layout, src, dst, lambda owned: {
            name: read_rows(arrays / f"node_{name}.npy", owned) for name in dataset["arrays"]["node_data"]},
            lambda inner: {name: read_rows(arrays / f"edge_{name}.npy", inner)
                           for name in dataset["arrays"].get("edge_data", [])})
        counts.update(host=socket.gethostname(), build_s=lap(start), peak_rss_mb=round(peak_rss_mb()))
        write_json(out / f"part{args.part}.counts.json", counts)
        emit_result({"changed": True, "out": str(out), "step": "part", **counts})
        return 0
    counts_files = [out / f"part{p}.counts.json" for p in range(args.num_parts)]
    parts = [read_json(path) or {} for path in counts_files]
    missing = [p for p, part in enumerate(parts) if not part]
    if missing:
        raise UserError(f"parts {missing} of {out} are not built: run --step part --part P for each first")
    PROGRESS.phase("lay out the assignment")
    layout = leanpart.Layout.of(np.load(out / ASSIGNMENT), dst, args.num_parts)
    PROGRESS.phase("write the ID mappings and config")
    manifest.update(leanpart.finish(out, layout, src, args.graph_name, args.part_method, parts))
    timings = {**manifest["timings"], "build_s": max(part["build_s"] for part in parts), "finish_s": lap(start)}
    if args.graphbolt:
        timings["graphbolt_s"] = to_graphbolt(out / manifest["part_config"])
    for path in (*counts_files, out / ASSIGNMENT):
        path.unlink()
    # The peak of any one host: what the builder is for.
    manifest.update(complete=True, graphbolt=args.graphbolt, timings=timings,
                    peak_rss_mb=max(manifest["peak_rss_mb"], round(peak_rss_mb()), *(p["peak_rss_mb"] for p in parts)))
    write_json(out / "manifest.json", manifest)
    emit_result({"changed": True, **summary(manifest, out)})
    return 0


def dgl_partition(args: argparse.Namespace, graph_file: Path, out: Path, part_config: Path,
                  manifest: dict[str, Any], timings: dict[str, float]) -> None:
    import dgl

    start = time.perf_counter()
    PROGRESS.phase("load graph.dgl")
    try:
        (graph,), _ = dgl.load_graphs(str(graph_file))
    except Exception as error:  # DGL raises plain DGLError/RuntimeError for unreadable files
        raise UserError(f"{graph_file} cannot be read ({error}); re-run `dglkit prepare`") from None
    timings["load_s"] = lap(start)

    start = time.perf_counter()
    PROGRESS.phase(f"partition_graph ({args.part_method})")
    orig_nids, orig_eids = dgl.distributed.partition_graph(
        graph, args.graph_name, args.num_parts, str(out), num_hops=args.num_hops, part_method=args.part_method,
        balance_ntypes=graph.ndata["train_mask"] if args.balance_train else None,
        balance_edges=args.balance_edges, return_mapping=True)
    timings["partition_s"] = lap(start)

    if graph.is_homogeneous:
        start = time.perf_counter()
        orig_nids, orig_eids = orig_nids.numpy(), orig_eids.numpy()
        np.save(out / "orig_nids.npy", orig_nids)
        np.save(out / "orig_eids.npy", orig_eids)
        timings["mapping_s"] = lap(start)

        start = time.perf_counter()
        with open(part_config) as f:
            config = json.load(f)
        manifest.update(cut_and_counts(graph, config, orig_nids))
        timings["edge_cut_s"] = lap(start)
    else:
        partition_hetero_outputs(graph, out, part_config, orig_nids, orig_eids, manifest, timings)


def partition_hetero_outputs(graph, out: Path, part_config: Path, orig_nids: dict, orig_eids: dict,
                             manifest: dict[str, Any], timings: dict[str, float]) -> None:
    """Per-type ID mappings and the edge cut and counts of a heterogeneous partition."""
    from dglkit import hetero

    start = time.perf_counter()
    hetero.save_mappings(out, orig_nids, orig_eids)
    timings["mapping_s"] = lap(start)
    start = time.perf_counter()
    manifest.update(hetero.cut_and_counts(graph, json.loads(part_config.read_text()), orig_nids))
    timings["edge_cut_s"] = lap(start)


def lap(start: float) -> float:
    return round(time.perf_counter() - start, 3)


def to_graphbolt(part_config: Path) -> float:
    """Add GraphBolt graphs to a DGL-format partition; partition_graph(use_graphbolt=True) does the same
    after partitioning, here it is a stage of its own so that its time shows and it can run alone."""
    from dgl.distributed import dgl_partition_to_graphbolt

    start = time.perf_counter()
    PROGRESS.phase("convert to GraphBolt")
    dgl_partition_to_graphbolt(str(part_config))
    return lap(start)


def cut_and_counts(graph, config: dict[str, Any], orig_nids: np.ndarray) -> dict[str, Any]:
    """Edge cut (DGL 2.1 prints 0 for homogeneous graphs) and owned nodes/edges/training nodes per part."""
    node_ranges = np.array(config["node_map"]["_N"])
    (edge_ranges,) = [np.array(ranges) for ranges in config["edge_map"].values()]
    sizes = node_ranges[:, 1] - node_ranges[:, 0]
    part_of = np.empty(len(orig_nids), np.int32)
    part_of[orig_nids] = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    src, dst = (ids.numpy() for ids in graph.edges())
    cut = int(np.count_nonzero(part_of[src] != part_of[dst]))
    train = graph.ndata["train_mask"].numpy()[orig_nids]
    parts = [{"part": i, "nodes": int(size), "edges": int(edges[1] - edges[0]),
              "train_nodes": int(np.count_nonzero(train[begin:end]))}
             for i, (size, edges, (begin, end)) in enumerate(zip(sizes, edge_ranges, node_ranges))]
    return {"num_nodes": graph.num_nodes(), "num_edges": graph.num_edges(), "parts": parts,
            "edge_cut": {"count": cut, "fraction": round(cut / max(graph.num_edges(), 1), 6)}}


def summary(manifest: dict[str, Any], out: Path) -> dict[str, Any]:
    return {"out": str(out), "part_config": str(out / manifest["part_config"]), "num_parts": manifest["num_parts"],
            "graphbolt": manifest["graphbolt"], "edge_cut_fraction": manifest["edge_cut"]["fraction"],
            "peak_rss_mb": manifest["peak_rss_mb"]}

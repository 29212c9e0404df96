"""`dglkit chunked`: write a synthetic graph in DGL's chunked graph format, chunk by chunk, and check one.

  generate --out DIR --dataset synthetic|synthetic-hetero --num-chunks C [--chunks i,j,...] [parameters]
      writes those chunks (default: all, then metadata.json): edges/<src:rel:dst>-<i>.csv (space-separated
      type-local ids, as DGL's tools/chunk_graph.py writes them), node_data/<type>/<name>-<i>.npy and
      manifests/chunk-<i>.json (the parameters and the chunk's edge counts, written last: the chunk is
      complete). Each chunk comes from (seed, i) alone (dglkit.chunkgen), so W hosts write their own chunks
      of the shared workspace in parallel and in memory the size of one chunk; a chunk whose manifest has
      the same parameters is not written again.
  finish --out DIR   once every chunk is there: metadata.json from the manifests (it names the chunks missing).
  check --path DIR [--chunks i,j,...]   reads and checks those chunks of any chunked graph (dglkit.chunked).
"""

import argparse
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dglkit import chunked, chunkgen, data
from dglkit.common import UserError, emit_result, peak_rss_mb, read_json, write_json
from dglkit.progress import PROGRESS
from dglkit.resources import MEMORY_HELP, check_fits, chunk_writer_estimate

MANIFESTS = "manifests"
# The labelled type's node data, one array per chunk each.
NODE_DATA = ("feat", "labels", *chunkgen.MASKS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    generate = actions.add_parser("generate", help="write chunks of a synthetic graph (all: and metadata.json)")
    generate.add_argument("--out", required=True, type=Path, help="the chunked graph's directory")
    generate.add_argument("--dataset", choices=("synthetic", "synthetic-hetero"), default="synthetic",
                          help="a community graph (one node type) or an academic graph like ogbn-mag (%(default)s)")
    generate.add_argument("--num-chunks", type=int, required=True, help="chunks per node and edge type")
    generate.add_argument("--chunks", type=chunk_list, help="comma-separated chunk indices to write (default: all, "
                          "then metadata.json)")
    generate.add_argument("--seed", type=int, default=data.setting_default("seed"),
                          help="seed of the generator (%(default)s)")
    data.add_synthetic_arguments(generate)
    generate.add_argument("--memory-gb", type=float, help=MEMORY_HELP)
    finish = actions.add_parser("finish", help="write metadata.json once every chunk is written")
    finish.add_argument("--out", required=True, type=Path, help="the chunked graph's directory")
    check = actions.add_parser("check", help="read and check chunks of a chunked graph against its metadata.json")
    check.add_argument("--path", required=True, type=Path, help="the chunked graph's directory")
    check.add_argument("--chunks", type=chunk_list, help="comma-separated chunk indices (default: all)")


def chunk_list(text: str) -> list[int]:
    try:
        chunks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give chunk indices like 0,2,5") from None
    if not chunks or min(chunks) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give chunk indices >= 0 like 0,2,5")
    return chunks


def run(args: argparse.Namespace) -> int:
    if args.action == "check":
        graph = chunked.load(args.path)
        chunks = range(graph.num_chunks) if args.chunks is None else args.chunks
        chunked.check_chunks(graph, chunks)
        emit_result({"changed": False, "path": str(args.path), "checked_chunks": list(chunks)})
        return 0
    if args.action == "finish":
        emit_result({"changed": finish(args.out), "out": str(args.out)})
        return 0
    params = generate_params(args)
    chunks = range(params["num_chunks"]) if args.chunks is None else args.chunks
    if max(chunks) >= params["num_chunks"]:
        raise UserError(f"--chunks {args.chunks}: chunk indices run from 0 to --num-chunks - 1 = "
                        f"{params['num_chunks'] - 1}")
    pending = [chunk for chunk in chunks if not is_written(args.out, params, chunk)]
    if pending:
        check_writer_fits(params, pending, args.out, args.memory_gb)
    start = time.perf_counter()
    written = [chunk for chunk in pending if write_chunk(args.out, params, chunk)]
    changed = bool(written)
    if args.chunks is None:
        changed = finish(args.out) or changed
    emit_result({"changed": changed, "out": str(args.out), "written_chunks": written,
                 "seconds": round(time.perf_counter() - start, 2), "peak_rss_mb": round(peak_rss_mb())})
    return 0


def check_writer_fits(params: dict[str, Any], chunks: list[int], out: Path, memory_gb: float | None) -> None:
    """Refuse, before writing anything, a chunk this host cannot hold or store (each is written alone)."""
    counts = chunkgen.chunk_counts(params["num_nodes"], params["num_chunks"])
    largest = max(counts[chunk] for chunk in chunks)
    memory, disk = chunk_writer_estimate(largest, params["avg_degree"], params["feat_dim"])
    check_fits(f"writing a chunk of {largest} nodes", memory, disk * len(chunks), out, memory_gb,
               ways_out="more chunks, each smaller (with dgl_job_partition_builder: mpi, one per worker: more "
               "workers), or a host with more memory")


def generate_params(args: argparse.Namespace) -> dict[str, Any]:
    params = {"dataset": args.dataset, "num_chunks": args.num_chunks, "seed": args.seed,
              "split": {"train": args.train_frac, "val": args.val_frac, "test": args.test_frac},
              **{key: getattr(args, key) for key in (
                  "num_nodes", "avg_degree", "num_classes", "feat_dim", "num_communities", "homophily", "label_noise")}}
    chunkgen.check_params(params)
    return params


def manifest_path(out: Path, chunk: int) -> Path:
    return out / MANIFESTS / f"chunk-{chunk}.json"


def edge_file(etype: str, chunk: int) -> str:
    return f"edges/{etype}-{chunk}.csv"


def node_file(ntype: str, name: str, chunk: int) -> str:
    return f"node_data/{ntype}/{name}-{chunk}.npy"


def is_written(out: Path, params: dict[str, Any], chunk: int) -> bool:
    """Whether the chunk's manifest (written last) says it is written with these parameters."""
    old = read_json(manifest_path(out, chunk))
    return bool(old and old.get("params") == params)


def write_chunk(out: Path, params: dict[str, Any], chunk: int) -> bool:
    """Chunk `chunk`'s files, one array in memory at a time; False when its manifest says it is written."""
    if is_written(out, params, chunk):
        return False
    manifest = manifest_path(out, chunk)
    (out / MANIFESTS).mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)
    (out / chunked.METADATA).unlink(missing_ok=True)  # never a metadata.json over chunks of other parameters
    start, edges = time.perf_counter(), {}
    # An array takes from seconds to minutes to make: the count of those written is the chunk's progress.
    arrays = len(chunkgen.edge_types(params)) + len(NODE_DATA)
    PROGRESS.phase(f"chunk {chunk} of {params['num_chunks']}: make and write its arrays", total=arrays, unit="arrays")
    for done, (kind, kind_type, name, value) in enumerate(chunkgen.generate(params, chunk), 1):
        if kind == "edges":
            path = out / edge_file(kind_type, chunk)
            edges[kind_type] = len(value[0])
            write_atomically(path, write_edges, *value)
        else:
            path = out / node_file(kind_type, name, chunk)
            write_atomically(path, np.save, value)
        del value
        PROGRESS.step(done)
    write_json(manifest, {"params": params, "num_edges": edges, "host": socket.gethostname(),
                          "seconds": round(time.perf_counter() - start, 2), "peak_rss_mb": round(peak_rss_mb())})
    return True


def write_atomically(path: Path, write: Callable[..., None], *values: np.ndarray) -> None:
    """write(file, *values) so that a file that exists is whole: under a temporary name, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f, *values)
    os.replace(tmp, path)


def write_edges(f, src: np.ndarray, dst: np.ndarray) -> None:
    import pandas as pd

    pd.DataFrame({"src": src, "dst": dst}).to_csv(f, sep=" ", header=False, index=False)


def finish(out: Path) -> bool:
    """metadata.json from the chunks' manifests; False when it is already there."""
    if (out / chunked.METADATA).is_file():
        return False
    # The newest chunk's parameters are the ones asked for last: the chunks that differ are the stale ones.
    manifests = sorted((out / MANIFESTS).glob("chunk-*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True) \
        if (out / MANIFESTS).is_dir() else []
    first = read_json(manifests[0]) if manifests else None
    if not first or "params" not in first:
        raise UserError(f"{out / MANIFESTS} holds no chunk manifest: run `dglkit chunked generate --out {out} ...` "
                        "first")
    params = first["params"]
    counts = [read_json(manifest_path(out, chunk)) for chunk in range(params["num_chunks"])]
    missing = [chunk for chunk, counted in enumerate(counts) if not counted or counted.get("params") != params]
    if missing:
        raise UserError(f"{out}: chunks {missing} are not written with the parameters of "
                        f"{manifests[0].name} (the newest): write them with `dglkit chunked generate --chunks "
                        f"{','.join(map(str, missing))}` and the same parameters")
    write_json(out / chunked.METADATA, metadata(params, [c["num_edges"] for c in counts if c]))
    return True


def metadata(params: dict[str, Any], edge_counts: list[dict[str, int]]) -> dict[str, Any]:
    """metadata.json as DGL's chunked graph format has it, paths relative to the directory."""
    node_types, edge_types = chunkgen.node_types(params), chunkgen.edge_types(params)
    chunks = range(params["num_chunks"])
    labelled = next(iter(node_types))  # the labelled type comes first (paper, or _N)
    return {
        "graph_name": params["dataset"].replace("-", "_"),
        "node_type": list(node_types),
        "num_nodes_per_chunk": [chunkgen.chunk_counts(count, params["num_chunks"]) for count in node_types.values()],
        "edge_type": edge_types,
        "num_edges_per_chunk": [[counts[etype] for counts in edge_counts] for etype in edge_types],
        "edges": {etype: {"format": {"name": "csv", "delimiter": " "}, "data": [edge_file(etype, i) for i in chunks]}
                  for etype in edge_types},
        "node_data": {labelled: {name: {"format": {"name": "numpy"}, "data": [node_file(labelled, name, i)
                                                                             for i in chunks]} for name in NODE_DATA}},
        "edge_data": {},
    }

"""`mpirun -np W python -m dglkit.mpiassign --dataset-dir D --num-parts K --out DIR`: the partition assignment
of a graph that no host holds, by PT-Scotch (dglkit.ptscotch) across W ranks, each holding about 1/W of it.

Rank r owns node IDs starts[r] .. starts[r+1] - 1 (dglkit.mpicomm) and:
0. of a graph in DGL's chunked format, reads and checks its chunks: a bad one refuses the run on every rank;
1. counts what it will receive, so that its adjacency buffer is allocated once, exactly;
2. reads its share of the edges in batches and sends each edge in both directions to the owner of its first
   end (Alltoallv, one batch a round): the owner keeps owned * N + neighbour keys and counts in-degrees;
3. sorts the keys into the local CSR of the symmetric simple graph (self loops and duplicates dropped);
4. runs PT-Scotch and writes its own slice of the assignment, `assignment-<r>.npy` (a file per rank: ranks
   writing one file through memory maps on NFS could overwrite each other's bytes in a page they share);
5. adds its counts per part and its edge cut to everyone's (Allreduce).
Rank 0 writes manifest.json last and renames `.<out>.partial` to DIR: a run that dies leaves no DIR.

PT-Scotch balances one vertex weight; METIS in partition_graph balances three at once (non-training nodes,
training nodes, in-edges). `--vertex-weight nodes` balances node counts, `degree` (1 + in-degree) nodes and
in-edges together; the manifest records every count per part so that what the others came to shows.
"""

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from dglkit import ptscotch
from dglkit.common import UserError, emit_result, peak_rss_mb, read_json, write_json
from dglkit.mpicomm import (
    BATCH_EDGES,
    PROGRESS,
    ArraysInput,
    ChunkedInput,
    check_input,
    exchange,
    lookup,
    mpi_main,
    open_input,
    owner,
    padded,
    ranges,
    rounds,
)

TRAIN_MASK = "train_mask"


def argument_parser() -> argparse.ArgumentParser:
    """The program's options (docs/cli.md is made from them too)."""
    parser = argparse.ArgumentParser(prog="mpirun -np W python -m dglkit.mpiassign")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset-dir", type=Path, help="a dataset prepared with --arrays, or a chunked one")
    source.add_argument("--chunked", type=Path, help="a graph in DGL's chunked format (its metadata.json's directory)")
    parser.add_argument("--out", required=True, type=Path, help="assignment directory (replaced when complete)")
    parser.add_argument("--num-parts", required=True, type=int, help="parts of the assignment")
    parser.add_argument("--vertex-weight", choices=("nodes", "degree"), default="nodes",
                        help="what the parts balance: nodes, or nodes plus in-edges (%(default)s)")
    parser.add_argument("--strategy", choices=tuple(ptscotch.STRATEGIES), default="quality",
                        help="PT-Scotch's strategy flag (%(default)s)")
    parser.add_argument("--imbalance", type=float, default=0.03, help="load imbalance allowed (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="PT-Scotch's random seed (%(default)s)")
    parser.add_argument("--batch-edges", type=int, default=BATCH_EDGES, help="edges per exchange round")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    args = argument_parser().parse_args(argv)
    if not 0 < args.imbalance < 1 or args.batch_edges < 1:
        raise UserError("--imbalance must be between 0 and 1 and --batch-edges positive")
    return args


def program(comm: Any, argv: list[str]) -> int:
    args = parse(argv)
    data = ChunkedInput(args.chunked) if args.chunked else open_input(args.dataset_dir)
    if not 2 <= args.num_parts <= data.num_nodes:
        raise UserError(f"--num-parts must be between 2 and the {data.num_nodes} nodes, got {args.num_parts}")
    rank, size = comm.Get_rank(), comm.Get_size()
    started = time.perf_counter()
    PROGRESS.phase("check")
    check_input(comm, data)
    starts = ranges(data.num_nodes, size)
    PROGRESS.phase("shuffle")
    keys, in_degree = shuffle(comm, data, starts, args.batch_edges)
    indptr, indices = local_csr([keys], len(in_degree), data.num_nodes)
    del keys
    shuffled, shuffle_peak = time.perf_counter(), peak_rss_mb()
    weights = None if args.vertex_weight == "nodes" else 1 + in_degree
    PROGRESS.phase("partition")
    parts = ptscotch.partition(comm, indptr, indices, args.num_parts, weights, args.strategy, args.imbalance,
                               args.seed)
    partitioned = time.perf_counter()
    train = (data.node_rows(TRAIN_MASK, starts[rank], starts[rank + 1]).astype(bool)
             if isinstance(data, ArraysInput) and TRAIN_MASK in data.node_data else None)
    counts = comm.allreduce(part_counts(parts, in_degree, train, args.num_parts))
    cut = edge_cut(comm, parts, indptr, indices, starts)
    tmp = args.out.with_name(f".{args.out.name}.partial")
    PROGRESS.phase("write")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    comm.Barrier()
    np.save(tmp / f"assignment-{rank}.npy", parts.astype(np.int32))
    ranks = comm.gather({"rank": rank, "host": os.uname().nodename, "peak_rss_mb": round(peak_rss_mb()),
                         "shuffle_peak_rss_mb": round(shuffle_peak),
                         "shuffle_s": round(shuffled - started, 3), "partition_s": round(partitioned - shuffled, 3)})
    if rank == 0:
        manifest = {"complete": True, "num_nodes": data.num_nodes, "num_edges": data.num_edges,
                    "dataset_fingerprint": data.fingerprint, "num_parts": args.num_parts,
                    "slices": [[int(a), int(b)] for a, b in zip(starts[:-1], starts[1:])],
                    "vertex_weight": args.vertex_weight, "strategy": args.strategy, "imbalance": args.imbalance,
                    "seed": args.seed,
                    "parts": [{"part": p, "nodes": int(n), "edges": int(e), "train_nodes": int(t)}
                              for p, (n, e, t) in enumerate(counts.T)],
                    "edge_cut": cut, "ranks": ranks, "seconds": round(time.perf_counter() - started, 3)}
        write_json(tmp / "manifest.json", manifest)  # last: a directory without it is not an assignment
        shutil.rmtree(args.out, ignore_errors=True)
        os.replace(tmp, args.out)
        emit_result({"changed": True, "out": str(args.out), "edge_cut": cut,
                     "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks)})
    comm.Barrier()  # every rank returns once DIR is in place
    PROGRESS.phase("done")
    return 0


def shuffle(comm: Any, data: ArraysInput | ChunkedInput, starts: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's adjacency keys (owned - first owned) * N + neighbour, both directions of every edge, self
    loops left out, duplicates still in; and the in-degree of each owned node (every edge counted)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    first, num_nodes = int(starts[rank]), data.num_nodes
    to_send = np.zeros(size, np.int64)
    for _, src, dst in data.edge_batches(rank, size, batch):
        to_send += np.bincount(owner(src[src != dst], starts), minlength=size)
        to_send += np.bincount(owner(dst, starts), minlength=size)
    to_receive = np.empty(size, np.int64)
    comm.Alltoall(to_send, to_receive)
    keys = np.empty(int(to_receive.sum()), np.int64)
    filled = 0
    in_degree = np.zeros(int(starts[rank + 1]) - first, np.int64)
    count = rounds(comm, data.num_batches(rank, size, batch))
    for _, src, dst in padded(data.edge_batches(rank, size, batch), count):
        loop = src == dst
        forward, _ = exchange(comm, np.stack([src[~loop], dst[~loop]], 1), owner(src[~loop], starts))
        backward, _ = exchange(comm, np.stack([dst, src], 1), owner(dst, starts))  # every edge: in-degrees
        in_degree += np.bincount(backward[:, 0] - first, minlength=len(in_degree))
        backward = backward[backward[:, 0] != backward[:, 1]]
        for rows in (forward, backward):
            keys[filled:filled + len(rows)] = (rows[:, 0] - first) * num_nodes + rows[:, 1]
            filled += len(rows)
    return keys[:filled], in_degree


def local_csr(holder: list[np.ndarray], num_local: int, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the owned rows from their keys, each distinct one once. `holder` is [keys]:
    emptied and the keys sorted in place, so that only the distinct copy outlives this call."""
    keys = holder.pop()
    keys.sort()
    distinct = np.empty(len(keys), bool)
    distinct[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=distinct[1:])
    indices = keys[distinct]
    del keys, distinct
    degree = np.zeros(num_local, np.int64)
    step = 1 << 24
    for begin in range(0, len(indices), step):
        degree += np.bincount(indices[begin:begin + step] // num_nodes, minlength=num_local)
    np.remainder(indices, num_nodes, out=indices)
    return np.concatenate([[0], np.cumsum(degree)]), indices


def part_counts(parts: np.ndarray, in_degree: np.ndarray, train: np.ndarray | None, num_parts: int) -> np.ndarray:
    """Owned nodes, their in-edges and their training nodes per part: rows of a (3, num_parts) array."""
    counts = np.zeros((3, num_parts), np.int64)
    counts[0] = np.bincount(parts, minlength=num_parts)
    np.add.at(counts[1], parts, in_degree)
    if train is not None:
        counts[2] = np.bincount(parts[train], minlength=num_parts)
    return counts


def edge_cut(comm: Any, parts: np.ndarray, indptr: np.ndarray, indices: np.ndarray, starts: np.ndarray
             ) -> dict[str, Any]:
    """Node pairs (edges of the symmetric simple graph: what the partitioner minimises) whose ends are in
    different parts, from the parts of this rank's neighbours, asked of their owners."""
    from mpi4py import MPI

    neighbours = np.unique(indices)
    neighbour_parts = lookup(comm, neighbours, starts, parts[:, None])[:, 0]
    crossing = 0
    step = 1 << 22
    for begin in range(0, len(indices), step):
        entries = np.arange(begin, min(begin + step, len(indices)))
        rows = np.searchsorted(indptr, entries, side="right") - 1
        ends = neighbour_parts[np.searchsorted(neighbours, indices[entries])]
        crossing += int(np.count_nonzero(parts[rows] != ends))
    crossing, entries_total = (comm.allreduce(value, op=MPI.SUM) for value in (crossing, len(indices)))
    return {"pairs": crossing // 2, "total_pairs": entries_total // 2,
            "fraction": round(crossing / max(entries_total, 1), 6)}


def load_assignment(directory: Path) -> np.ndarray:
    """The whole assignment (node ID -> part) of a complete assignment directory, for one host's use."""
    manifest = read_json(directory / "manifest.json")
    if not manifest or not manifest.get("complete"):
        raise UserError(f"{directory} holds no complete assignment: run dglkit.mpiassign again")
    return np.concatenate([np.load(directory / f"assignment-{r}.npy") for r in range(len(manifest["slices"]))])


if __name__ == "__main__":
    mpi_main(program)

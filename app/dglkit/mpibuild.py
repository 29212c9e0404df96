"""`mpirun -np K python -m dglkit.mpibuild --dataset-dir D --assignment A --out DIR`: DGL's partition of a
graph that no host holds, rank P writing part P from the assignment dglkit.mpiassign left in A. The files are
the lean builder's (dglkit.leanpart) for the same assignment, written by the same functions.

Rank r owns node IDs starts[r] .. starts[r+1] - 1 and edges E * r // K .. E * (r + 1) // K - 1 (dglkit.mpicomm):
1. new node IDs: parts own contiguous ranges, original order within a part. From the per-rank counts of each
   part (Allgather) rank r numbers its own nodes; each node's ID pair goes to its part, which then reads its
   nodes' rows of the arrays' node data (a block at a time) or, of a chunked graph, receives them from the
   ranks that read the node chunks (chunk i of a type on rank i mod K), and writes node_feat.dgl;
2. new edge IDs: an edge belongs to its destination's part, original order within a part. A first pass over
   the rank's edges counts them per segment (its range of the arrays, or each chunk) and part (the ends' parts
   asked of their owners); a second numbers them and
   sends each to its destination's part (the in-edges of its nodes) and, when its source is in another part,
   to the source's part too (its nodes' out-edges into other parts);
3. part P keeps as halo nodes, as partition_graph does for one hop, the other parts' sources of its in-edges
   and the destinations of those out-edges, which it keeps too, and writes graph.dgl; each rank writes its
   part's range of orig_nids.npy and orig_eids.npy in place (write calls at its offset, not memory maps: NFS
   writes those whole pages).
With --graphbolt each rank then writes its part's GraphBolt graph (dglkit.boltpart). Rank 0 writes
<graph>.json and manifest.json last and renames `.<out>.partial` to DIR.

A heterogeneous graph (DGL's chunked format, several node or edge types) comes out as partition_graph writes
one: homogeneous IDs have the types in metadata order, so "original order within a part" already lays a part's
nodes (edges) out type by type, each type's a contiguous range (node_map/edge_map per type in the config, from
the counts per part and type: parts x types numbers); node data goes under `<node type>/<name>`, graph.dgl
carries `_TYPE` of its nodes and edges, and the ID mappings are per type, type-local IDs as DGL returns them
(orig_nids.npz, orig_eids.npz: each rank writes its ranges of one .npy per type, which rank 0 then copies into
the archive a block at a time).

Edge data (a chunked graph's edge_data) travels with its edge: the rank that reads an edge chunk reads the same
rows of the chunk's data files and sends each row, as int64 words of its bytes (as node data rows go), in the
edge's own row to its destination's part, which writes edge_feat.dgl as partition_graph does: the data of its
inner edges (the in-edges of its nodes) in new-ID order, under `<src:rel:dst>/<name>` (`_N:_E:_N/<name>` for a
homogeneous graph).
"""

import argparse
import io
import os
import shutil
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dglkit import boltpart, leanpart
from dglkit.common import UserError, emit_result, peak_rss_mb, read_json, write_json
from dglkit.mpicomm import (
    BATCH_EDGES,
    BATCH_ROW_BYTES,
    PROGRESS,
    ArraysInput,
    ChunkedInput,
    Input,
    Types,
    exchange,
    lookup,
    mpi_main,
    open_input,
    owner,
    padded,
    ranges,
    rounds,
)
from dglkit.partition import read_rows


def argument_parser() -> argparse.ArgumentParser:
    """The program's options (docs/cli.md is made from them too)."""
    parser = argparse.ArgumentParser(prog="mpirun -np NUM_PARTS python -m dglkit.mpibuild")
    parser.add_argument("--dataset-dir", required=True, type=Path,
                        help="a dataset prepared with --arrays, or a graph in DGL's chunked format (its dataset.json)")
    parser.add_argument("--assignment", required=True, type=Path, help="the directory dglkit.mpiassign wrote")
    parser.add_argument("--out", required=True, type=Path, help="partition directory (replaced when complete)")
    parser.add_argument("--graph-name", default="graph", help="DistGraph name; the config is <name>.json")
    parser.add_argument("--batch-edges", type=int, default=BATCH_EDGES,
                        help="edges (and at most as many node data rows) per exchange round")
    parser.add_argument("--graphbolt", action="store_true",
                        help="also write each part's GraphBolt graph (for use_graphbolt=True), on its own rank")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    return argument_parser().parse_args(argv)


@dataclass
class TypedRanges:
    """Where the new IDs of each part's items (nodes or edges) of each type lie: part p's items of type t are
    starts[p * T + t] .. starts[p * T + t + 1] - 1, a part's items type by type (T = 1: a homogeneous graph)."""
    counts: np.ndarray  # parts x types
    starts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.starts = np.concatenate([[0], np.cumsum(self.counts.reshape(-1))]).astype(np.int64)

    def part_starts(self) -> np.ndarray:
        return self.starts[::self.counts.shape[1]]

    def block(self, p: int, t: int) -> tuple[int, int]:
        """(first new ID, count) of part p's items of type t."""
        return int(self.starts[p * self.counts.shape[1] + t]), int(self.counts[p, t])

    def type_of(self, new_ids: np.ndarray) -> np.ndarray:
        return owner(new_ids, self.starts) % self.counts.shape[1]


def check_supported(dataset_dir: Path, data: Input, graphbolt: bool = False) -> None:
    """What the builder does not carry is refused, not dropped: GraphBolt graphs of heterogeneous parts (the kit's
    RGCN trainer samples with DGL's own sampler)."""
    if graphbolt and data.types.heterogeneous:
        raise UserError(f"{dataset_dir} is heterogeneous: the mpi builder writes GraphBolt graphs of homogeneous "
                        "parts only (set dgl_job_graphbolt=false)")


def check_assignment(args: argparse.Namespace, data: Input, num_parts: int) -> dict[str, Any]:
    check_supported(args.dataset_dir, data, args.graphbolt)
    manifest = read_json(args.assignment / "manifest.json")
    if not manifest or not manifest.get("complete"):
        raise UserError(f"{args.assignment} holds no complete assignment: run dglkit.mpiassign first")
    if manifest["num_nodes"] != data.num_nodes or manifest["dataset_fingerprint"] != data.fingerprint:
        raise UserError(f"{args.assignment} is the assignment of another dataset than {args.dataset_dir}")
    if manifest["num_parts"] != num_parts:
        raise UserError(f"{args.assignment} has {manifest['num_parts']} parts: run with mpirun -np {manifest['num_parts']}")
    return manifest


def program(comm: Any, argv: list[str]) -> int:
    args = parse(argv)
    data = open_input(args.dataset_dir)
    rank, num_parts = comm.Get_rank(), comm.Get_size()
    assignment = check_assignment(args, data, num_parts)
    started = time.perf_counter()
    starts = ranges(data.num_nodes, num_parts)
    PROGRESS.phase("relabel")
    table, node_starts = node_table(comm, args.assignment, assignment["slices"], starts)
    nodes = type_counts(comm, table[:, 0], starts, data.types.node_starts)
    owned = owned_nodes(comm, table, starts)
    tmp = args.out.with_name(f".{args.out.name}.partial")
    offsets = start_output(comm, tmp, id_files(data.types))
    part_dir = tmp / f"part{rank}"
    part_dir.mkdir()
    PROGRESS.phase("send node data")
    train_nodes = leanpart.write_node_data(part_dir, part_node_data(comm, data, owned, starts, table, nodes,
                                                                    args.batch_edges))
    write_ids(tmp, offsets, "nids", owned, nodes, rank, data.types)
    del owned
    PROGRESS.phase("count edges")
    edges, bases = edge_ranges(comm, data, starts, table, args.batch_edges)
    edge_starts = edges.part_starts()
    PROGRESS.phase("send edges")
    inner, candidates, cut = send_edges(comm, data, starts, table, edge_starts, bases, args.batch_edges)
    del table
    write_ids(tmp, offsets, "eids", inner[:, 0], edges, rank, data.types)
    PROGRESS.phase("write")
    leanpart.write_edge_data(part_dir, part_edge_data(inner[:, 3:], data, edges, rank))
    halo = write_part_graph(part_dir, rank, nodes, edges, inner, candidates, data.types.heterogeneous)
    counts = {"part": rank, "nodes": int(node_starts[rank + 1] - node_starts[rank]), "edges": len(inner),
              "train_nodes": train_nodes, "halo_nodes": halo}
    del inner, candidates
    if args.graphbolt:
        PROGRESS.phase("convert to GraphBolt")
        boltpart.convert(part_dir)
    parts = comm.gather({**counts, "host": os.uname().nodename, "peak_rss_mb": round(peak_rss_mb())})
    cut = comm.allreduce(cut)
    if rank == 0:
        finish(args, tmp, data, assignment, (nodes, edges), parts, cut, time.perf_counter() - started)
    comm.Barrier()  # every rank returns once DIR is in place
    PROGRESS.phase("done")
    return 0


def node_table(comm: Any, directory: Path, slices: list[list[int]], starts: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(part, new ID) of each of this rank's nodes, and where each part's new IDs start."""
    rank, num_parts = comm.Get_rank(), comm.Get_size()
    first, last = int(starts[rank]), int(starts[rank + 1])
    part = np.concatenate([np.load(directory / f"assignment-{i}.npy", mmap_mode="r")[max(a, first) - a:min(b, last) - a]
                           for i, (a, b) in enumerate(slices) if a < last and first < b] + [np.zeros(0, np.int32)])
    part = part.astype(np.int64)
    counts = np.bincount(part, minlength=num_parts)
    every = np.array(comm.allgather(counts))  # ranks x parts
    node_starts = np.concatenate([[0], np.cumsum(every.sum(0))])
    new = numbered(part, node_starts[:-1] + every[:rank].sum(0))
    return np.stack([part, new], 1), node_starts


def numbered(groups: np.ndarray, bases: np.ndarray) -> np.ndarray:
    """bases[g] + the rank of each item among the items of its group g, in order."""
    order = np.argsort(groups, kind="stable")
    counts = np.bincount(groups, minlength=len(bases))
    sorted_groups = groups[order]
    result = np.empty(len(groups), np.int64)
    result[order] = bases[sorted_groups] + np.arange(len(groups)) - (np.cumsum(counts) - counts)[sorted_groups]
    return result


def type_counts(comm: Any, part: np.ndarray, starts: np.ndarray, type_starts: np.ndarray) -> TypedRanges:
    """Every part's nodes of each type (parts x types, summed over the ranks' own nodes, whose types follow from
    their homogeneous IDs). Collective."""
    first, num_types = int(starts[comm.Get_rank()]), len(type_starts) - 1
    ntype = owner(np.arange(first, first + len(part)), type_starts)
    counts = np.bincount(part * num_types + ntype, minlength=comm.Get_size() * num_types)
    return TypedRanges(comm.allreduce(counts).reshape(comm.Get_size(), num_types))


def owned_nodes(comm: Any, table: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The original IDs of this rank's part's nodes, in new-ID order (which is their order)."""
    first = int(starts[comm.Get_rank()])
    pairs = np.stack([table[:, 1], np.arange(first, first + len(table))], 1)
    received, _ = exchange(comm, pairs, table[:, 0])
    return received[np.argsort(received[:, 0]), 1]


def part_node_data(comm: Any, data: Input, owned: np.ndarray, starts: np.ndarray,
                   table: np.ndarray, nodes: TypedRanges, batch: int) -> dict[str, np.ndarray]:
    """Every node data's rows of this rank's part, in new-ID order, under DGL's key `<node type>/<name>`: read
    from the arrays' rows of `owned` (the part's original IDs), or sent to the part by the ranks that read the
    chunks."""
    if isinstance(data, ArraysInput):
        return {f"_N/{name}": read_rows(data.dir / f"node_{name}.npy", owned) for name in data.node_data}
    return {f"{data.types.nodes[t]}/{name}": received_rows(comm, data, t, name, starts, table,
                                                          nodes.block(comm.Get_rank(), t), batch)
            for t, name in data.node_data_items}


def received_rows(comm: Any, data: ChunkedInput, t: int, name: str, starts: np.ndarray, table: np.ndarray,
                  block: tuple[int, int], batch: int) -> np.ndarray:
    """Node type t's data `name` of this rank's part (its nodes of the type: new IDs block[0] .. block[0] +
    block[1] - 1), in new-ID order: each rank reads its chunks a batch of rows a round, asks the owners of their
    nodes for (part, new ID) and sends each row, as int64 words of its bytes after its new ID, to its part.
    Collective."""
    rank, size = comm.Get_rank(), comm.Get_size()
    fmt = data.data_format("node", data.graph.node_types[t], name)
    per_round = max(1, min(batch, BATCH_ROW_BYTES // (8 * fmt.words + 8)))
    mine = sum(-(-count // per_round) for count in data.node_chunks(t, rank, size))
    count = rounds(comm, mine)
    batches = data.node_batches(t, name, rank, size, per_round)
    first, length = block
    received = np.zeros((length, fmt.words), np.int64)
    for done in range(count):
        ids, rows = next(batches, (np.zeros(0, np.int64), np.zeros((0, *fmt.shape), fmt.dtype)))
        PROGRESS.step(done + 1, count)
        placed = lookup(comm, ids, starts, table)
        got, _ = exchange(comm, np.concatenate([placed[:, 1:], fmt.pack(rows)], 1), placed[:, 0])
        received[got[:, 0] - first] = got[:, 1:]
    return fmt.unpack(received)


def npy_header(length: int) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (length,)})
    return header.getvalue()


def id_files(types: Types) -> dict[str, int]:
    """The ID mappings' files and their lengths: orig_nids.npy and orig_eids.npy of a homogeneous graph; of a
    heterogeneous one, a file per type (orig_nids.<t>.npy, orig_eids.<t>.npy), the archives' members to be."""
    if not types.heterogeneous:
        return {"orig_nids.npy": int(types.node_starts[-1]), "orig_eids.npy": int(types.edge_starts[-1])}
    return {f"orig_{kind}.{t}.npy": int(n) for kind, type_starts in (("nids", types.node_starts), ("eids", types.edge_starts))
            for t, n in enumerate(np.diff(type_starts))}


def start_output(comm: Any, tmp: Path, lengths: dict[str, int]) -> dict[str, int]:
    """The temporary output directory with the ID mapping files at full size for the ranks to fill; return each
    file's data offset."""
    if comm.Get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, length in lengths.items():
            with open(tmp / name, "wb") as f:
                f.write(npy_header(length))
                f.truncate(len(npy_header(length)) + 8 * length)
    comm.Barrier()
    return {name: len(npy_header(length)) for name, length in lengths.items()}


def write_at(path: Path, offsets: dict[str, int], index: int, values: np.ndarray) -> None:
    """values (int64) at items index .. of the .npy file `path`."""
    with open(path, "r+b") as f:  # plain writes at an offset
        f.seek(offsets[path.name] + 8 * index)
        np.ascontiguousarray(values, dtype="<i8").tofile(f)


def write_ids(tmp: Path, offsets: dict[str, int], kind: str, ids: np.ndarray, typed: TypedRanges, rank: int,
              types: Types) -> None:
    """This part's original IDs (`ids`: homogeneous, in new-ID order) at its place in the mapping of `kind`
    (nids, eids): of a heterogeneous graph, each type's as type-local IDs at the part's place among the type's."""
    type_starts = types.node_starts if kind == "nids" else types.edge_starts
    begin = 0
    for t, count in enumerate(typed.counts[rank]):
        name = f"orig_{kind}.{t}.npy" if types.heterogeneous else f"orig_{kind}.npy"
        write_at(tmp / name, offsets, int(typed.counts[:rank, t].sum()), ids[begin:begin + count] - type_starts[t])
        begin += count


def pack_ids(tmp: Path, kind: str, names: list[str]) -> None:
    """orig_<kind>.npz from the per-type files, as np.savez writes it (a zip of .npy members, stored), a block
    at a time: the whole mapping is never in memory."""
    with zipfile.ZipFile(tmp / f"orig_{kind}.npz", "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for t, name in enumerate(names):
            piece = tmp / f"orig_{kind}.{t}.npy"
            with open(piece, "rb") as source, archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                shutil.copyfileobj(source, member, 1 << 24)
            piece.unlink()

def ends(comm: Any, data: Input, starts: np.ndarray, table: np.ndarray, batch: int
         ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(first edge ID, source (part, new ID) rows, destination rows, source IDs) of this rank's edges, a
    batch a round; empty batches once its share is done, until every rank's is."""
    rank, size = comm.Get_rank(), comm.Get_size()
    count = rounds(comm, data.num_batches(rank, size, batch))
    for first, src, dst in padded(data.edge_batches(rank, size, batch), count):
        rows = lookup(comm, np.concatenate([src, dst]), starts, table)
        yield first, rows[:len(src)], rows[len(src):], src


def edge_ranges(comm: Any, data: Input, starts: np.ndarray, table: np.ndarray, batch: int
                ) -> tuple[TypedRanges, np.ndarray]:
    """Each part's edges of each type, and where the new IDs of each segment's edges into each part start
    (segments x parts; a segment is a rank's range of the arrays, or a chunk, of one edge type), from every
    rank's count of its edges per segment and destination part: new IDs follow the original order within a part,
    whichever rank reads which segment, and so a part's edges come type by type (segments are in type order)."""
    segments, num_parts = data.segment_starts(comm.Get_size()), comm.Get_size()
    counts = np.zeros((len(segments), num_parts), np.int64)
    for first, _, dst_rows, _ in ends(comm, data, starts, table, batch):
        counts[segment_of(segments, first)] += np.bincount(dst_rows[:, 0], minlength=num_parts)
    counts = comm.allreduce(counts)
    segment_types = data.segment_types(comm.Get_size())
    typed = TypedRanges(np.stack([counts[segment_types == e].sum(0) for e in range(len(data.types.edges))], 1))
    return typed, typed.part_starts()[:-1] + np.cumsum(counts, 0) - counts


def segment_of(segments: np.ndarray, first: int) -> int:
    """The segment of the batch whose first edge ID is `first` (a batch never spans two)."""
    return int(np.searchsorted(segments, first, side="right")) - 1


def send_edges(comm: Any, data: Input, starts: np.ndarray, table: np.ndarray, edge_starts: np.ndarray,
               bases: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray, int]:
    """This part's in-edges as rows (original ID, new source, new destination, then the words of the edge's
    data: edge_words), row i the one of new ID edge_starts[p] + i; the other parts' edges out of its nodes into
    theirs as rows (new ID, new source, new destination) in new-ID order; and how many of this rank's edges join
    two parts. bases[s, q]: the new ID of segment s's first edge into part q."""
    rank, size = comm.Get_rank(), comm.Get_size()
    first_id, width = int(edge_starts[rank]), edge_words(data)
    segments, next_ids = data.segment_starts(size), bases.copy()  # the next edge's of each segment
    inner = np.empty((int(edge_starts[rank + 1]) - first_id, 3 + width), np.int64)
    payload = data.edge_data_batches(rank, size, batch, width) if width else None
    candidates, cut = [], 0
    for first, src_rows, dst_rows, src in ends(comm, data, starts, table, batch):
        next_id = next_ids[segment_of(segments, first)]
        new_eids = numbered(dst_rows[:, 0], next_id)
        next_id += np.bincount(dst_rows[:, 0], minlength=len(next_id))
        rows = [np.stack([new_eids, np.arange(first, first + len(src)), src_rows[:, 1], dst_rows[:, 1]], 1)]
        if payload is not None:  # the edges' data rows go with them to their part
            rows.append(next(payload, np.zeros((0, width), np.int64)))
        received, _ = exchange(comm, np.concatenate(rows, 1), dst_rows[:, 0])
        inner[received[:, 0] - first_id] = received[:, 1:]  # each row at its place: no sort
        crossing = np.flatnonzero(src_rows[:, 0] != dst_rows[:, 0])
        cut += len(crossing)
        received, _ = exchange(comm, np.stack([new_eids[crossing], src_rows[crossing, 1], dst_rows[crossing, 1]], 1),
                               src_rows[crossing, 0])
        candidates.append(received)
    candidate_rows = np.concatenate(candidates)
    return inner, candidate_rows[np.argsort(candidate_rows[:, 0])], cut


def edge_words(data: Input) -> int:
    """The words of an edge's data as it travels with its edge (send_edges): its type's data one after another,
    every type's in as many words as the widest type's."""
    return max(sum(fmt.words for _, fmt in fields) for fields in data.edge_formats)


def part_edge_data(payload: np.ndarray, data: Input, edges: TypedRanges, p: int) -> dict[str, np.ndarray]:
    """Every edge data's rows of part p's edges of its type, as partition_graph stores them: its inner edges (the
    in-edges of its nodes) in new-ID order, under DGL's key `<src:rel:dst>/<name>` (`_N:_E:_N/<name>` for a
    homogeneous graph). payload: the words the part's edges came with, row i the edge of new ID edge_starts[p] + i."""
    result = {}
    first = int(edges.part_starts()[p])
    for e, fields in enumerate(data.edge_formats):
        begin, count = edges.block(p, e)
        offset = 0
        for name, fmt in fields:
            rows = payload[begin - first:begin - first + count, offset:offset + fmt.words]
            result[f"{data.types.edges[e]}/{name}"] = fmt.unpack(rows)
            offset += fmt.words
    return result


def write_part_graph(part_dir: Path, p: int, nodes: TypedRanges, edges: TypedRanges, inner: np.ndarray,
                     candidates: np.ndarray, heterogeneous: bool) -> int:
    """graph.dgl of part p from its in-edges and the candidates; return its number of halo nodes."""
    node_starts, first_id = nodes.part_starts(), int(edges.part_starts()[p])
    node_start, num_owned = int(node_starts[p]), int(node_starts[p + 1] - node_starts[p])
    sources = inner[:, 1]
    # One hop, as partition_graph keeps it: the other parts' sources of the in-edges, the destinations of the
    # owned nodes' out-edges into other parts (the candidates, every one kept).
    halo = np.unique(np.concatenate([sources[(sources < node_start) | (sources >= node_start + num_owned)],
                                     candidates[:, 2]]))
    outer = candidates

    def local(new: np.ndarray) -> np.ndarray:
        owned = (new >= node_start) & (new < node_start + num_owned)
        return np.where(owned, new - node_start, num_owned + np.searchsorted(halo, new))

    edge_ends = np.empty((2, len(inner) + len(outer)), np.int64)
    for end in (0, 1):
        edge_ends[end, :len(inner)], edge_ends[end, len(inner):] = local(inner[:, 1 + end]), local(outer[:, 1 + end])
    new_eids = np.concatenate([np.arange(first_id, first_id + len(inner)), outer[:, 0]])
    types = (nodes.type_of(np.concatenate([np.arange(node_start, node_start + num_owned), halo])),
             edges.type_of(new_eids)) if heterogeneous else None
    leanpart.save_part_graph(part_dir, p, node_start, num_owned, halo, owner(halo, node_starts), edge_ends,
                             new_eids, len(inner), types)
    return len(halo)


def finish(args: argparse.Namespace, tmp: Path, data: Input, assignment: dict[str, Any],
           typed: tuple[TypedRanges, TypedRanges], parts: list[dict[str, Any]], cut: int, seconds: float) -> None:
    """Rank 0, once every part is written: the per-type ID mappings of a heterogeneous graph, the config, the
    manifest (last), then the directory's own name."""
    types = data.types
    if types.heterogeneous:
        pack_ids(tmp, "nids", types.nodes)
        pack_ids(tmp, "eids", types.edges)
    leanpart.write_config(tmp, args.graph_name, "ptscotch", typed[0].starts, typed[1].starts, types.nodes, types.edges)
    if args.graphbolt:
        boltpart.add_to_config(tmp / f"{args.graph_name}.json")
    manifest = {"complete": True, "dataset_dir": str(args.dataset_dir.resolve()), "dataset_fingerprint": data.fingerprint,
                "graphbolt": args.graphbolt, "part_config": f"{args.graph_name}.json", "num_parts": len(parts),
                "num_nodes": data.num_nodes, "num_edges": data.num_edges, "heterogeneous": types.heterogeneous,
                "parts": parts,
                "edge_cut": {"count": cut, "fraction": round(cut / max(data.num_edges, 1), 6)},
                "assignment": {key: assignment[key] for key in ("vertex_weight", "strategy", "imbalance", "edge_cut")},
                "build_s": round(seconds, 3), "peak_rss_mb": max(part["peak_rss_mb"] for part in parts)}
    write_json(tmp / "manifest.json", manifest)
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(tmp, args.out)
    emit_result({"changed": True, "out": str(args.out), "part_config": str(args.out / manifest["part_config"]),
                 "edge_cut_fraction": manifest["edge_cut"]["fraction"], "peak_rss_mb": manifest["peak_rss_mb"]})


if __name__ == "__main__":
    mpi_main(program)

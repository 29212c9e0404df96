"""The lean builder of `dglkit partition`: DGL's partition format for a homogeneous graph with a fraction of
the memory of `dgl.distributed.partition_graph`.

partition_graph keeps the input graph, its homogeneous copy, METIS' symmetric copy, the reshuffled graph and
every part with its halo in memory at once (about 215 bytes per edge). Here:
1. a child process (`python -m dglkit.leanpart assign`) reads the structure, builds the symmetric graph METIS
   needs without self loops or duplicate pairs, runs DGL's METIS with partition_graph's weights (training
   nodes and in-degrees balanced) and saves the assignment; its memory is returned when it exits;
2. this process reads the graph once and writes one part at a time: the part's owned nodes renumbered to a
   contiguous range, the in-edges of owned nodes (renumbered to a contiguous range too) and, as
   partition_graph does for one hop, the owned nodes' out-edges into other parts, marked not inner (halo
   nodes: the other ends of both).
The files are the ones partition_graph writes (graph.dgl with _ID/inner_node/part_id and _ID/inner_edge,
node_feat.dgl, edge_feat.dgl with the inner edges' data of graph.dgl's edata, <graph>.json); DistGraph and
dgl_partition_to_graphbolt read them unchanged.

`--builder distributed` (dglkit.partition) runs the same steps on several hosts from a dataset's arrays/
(memory maps): the assignment from the structure alone, then each part on a worker of its own, reading only
its nodes' rows of the features, then the mappings and config: the same files as `build`.
"""

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dglkit.progress import PROGRESS


def assign_in_child(graph_file: Path, out: Path, num_parts: int, method: str, balance_train: bool,
                    balance_edges: bool) -> None:
    """Run the assignment in a child process so that METIS' memory is gone before the parts are built."""
    cmd = [sys.executable, "-m", "dglkit.leanpart", "assign", "--graph", str(graph_file), "--out", str(out),
           "--num-parts", str(num_parts), "--method", method,
           *([] if balance_train else ["--no-balance-train"]), *([] if balance_edges else ["--no-balance-edges"])]
    package_root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    print(proc.stdout + proc.stderr, file=sys.stderr, end="")  # DGL's METIS log: the edge cut it found
    if proc.returncode:
        raise RuntimeError(f"the METIS assignment process exited {proc.returncode}: {proc.stderr[-2000:]}")


def stable_sort(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and the stable order, as numpy's argsort(kind="stable"): torch's radix sort of integers
    on every core."""
    import torch

    result = torch.sort(torch.from_numpy(values), stable=True)
    return result.values.numpy(), result.indices.numpy()


def undirected_pairs(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Each distinct non-loop edge once, as low * num_nodes + high, sorted."""
    keys = np.empty(len(src), np.int64)
    step = 1 << 24  # in slices, so that the temporaries stay small
    for begin in range(0, len(src), step):
        s, d = src[begin:begin + step], dst[begin:begin + step]
        keys[begin:begin + step] = np.minimum(s, d) * num_nodes + np.maximum(s, d)
        keys[begin:begin + step][s == d] = -1
    keys = stable_sort(keys)[0]
    distinct = np.empty(len(keys), bool)
    distinct[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=distinct[1:])
    distinct &= keys >= 0
    return keys[distinct]


def symmetric_graph(pairs: np.ndarray, num_nodes: int):
    """Both directions of every pair, as the CSC-only graph DGL's METIS reads, written straight into its
    index arrays (a COO graph and the CSC DGL would build from it would hold twice as much)."""
    import dgl
    import torch

    low = pairs // num_nodes
    high = pairs
    high -= low * num_nodes  # in place: pairs becomes the high ends
    from_low, from_high = np.bincount(low, minlength=num_nodes), np.bincount(high, minlength=num_nodes)
    indptr = np.concatenate([[0], np.cumsum(from_low + from_high)])
    indices = np.empty(2 * len(pairs), np.int64)
    # Column v holds first the high ends of pairs (v, h), which `low` being sorted keeps together, then the
    # low ends of pairs (l, v), grouped by a stable sort on `high`. Slices keep the temporaries small.
    starts_low = np.cumsum(from_low) - from_low
    sorted_high, by_high = stable_sort(high)
    starts_high = np.cumsum(from_high) - from_high
    step = 1 << 24
    for begin in range(0, len(pairs), step):
        rank = np.arange(begin, min(begin + step, len(pairs)))
        v = low[begin:begin + step]
        indices[indptr[v] + rank - starts_low[v]] = high[begin:begin + step]
        v = sorted_high[begin:begin + step]
        indices[indptr[v] + from_low[v] + rank - starts_high[v]] = low[by_high[begin:begin + step]]
    del low, high, sorted_high, by_high
    return dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.zeros(0, dtype=torch.int64))),
                     num_nodes=num_nodes, idtype=torch.int64)


def metis_assignment(graph_file: Path, num_parts: int, balance_train: bool, balance_edges: bool) -> np.ndarray:
    """partition_graph's METIS call on the graph of a graph.dgl file."""
    import dgl

    (graph,), _ = dgl.load_graphs(str(graph_file))
    num_nodes = graph.num_nodes()
    train = graph.ndata["train_mask"].numpy().astype(bool) if balance_train else None
    edges = [ids.numpy() for ids in graph.edges()]
    del graph
    return metis_parts(edges, num_nodes, train, num_parts, balance_edges)


def metis_parts(edges: list[np.ndarray], num_nodes: int, train: np.ndarray | None, num_parts: int,
                balance_edges: bool) -> np.ndarray:
    """partition_graph's METIS call (same vertex weights, same options) on a compact symmetric graph; `train`
    (a mask) balances training nodes when given. `edges` is [src, dst]: emptied here, so that the caller's
    copy does not outlive its use."""
    import dgl
    import torch
    from dgl.partition import _CAPI_DGLMetisPartition_Hetero

    src, dst = edges
    edges.clear()
    weights = [] if train is None else [~train, train]
    if balance_edges:
        weights.append(np.bincount(dst, minlength=num_nodes))  # in-degrees
    vwgt = np.stack(weights, 1).astype(np.int64).reshape(-1) if weights else np.zeros(0, np.int64)
    del weights
    pairs = undirected_pairs(src, dst, num_nodes)
    del src, dst
    sym = symmetric_graph(pairs, num_nodes)
    del pairs
    parts = _CAPI_DGLMetisPartition_Hetero(sym._graph, num_parts, dgl.backend.to_dgl_nd(torch.from_numpy(vwgt)),
                                           "k-way", True)
    return dgl.backend.zerocopy_from_dgl_ndarray(parts).numpy()


def random_parts(num_nodes: int, num_parts: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, num_parts, num_nodes)


def argument_parser() -> argparse.ArgumentParser:
    """The assignment child's options (docs/cli.md is made from them too)."""
    parser = argparse.ArgumentParser(prog="python -m dglkit.leanpart assign")
    parser.add_argument("--graph", required=True, type=Path,
                        help="the dataset's graph.dgl (its structure and train_mask are read)")
    parser.add_argument("--out", required=True, type=Path, help="the assignment: one int32 part per node (.npy)")
    parser.add_argument("--num-parts", required=True, type=int, help="parts")
    parser.add_argument("--method", choices=("metis", "random"), default="metis", help="how (%(default)s)")
    parser.add_argument("--no-balance-train", dest="balance_train", action="store_false",
                        help="metis: do not balance the training nodes across the parts")
    parser.add_argument("--no-balance-edges", dest="balance_edges", action="store_false",
                        help="metis: do not balance the in-edges across the parts")
    return parser


def assign_main(argv: list[str]) -> int:
    args = argument_parser().parse_args(argv)
    if args.method == "metis" and args.num_parts > 1:
        parts = metis_assignment(args.graph, args.num_parts, args.balance_train, args.balance_edges)
    else:
        import dgl

        parts = random_parts(dgl.load_graphs(str(args.graph))[0][0].num_nodes(), args.num_parts)
    np.save(args.out, parts.astype(np.int32))
    return 0


@dataclass
class Layout:
    """Where every node and edge goes, from the assignment and the edges' destinations alone: parts own
    contiguous ranges of new node IDs (original order within a part) and of new edge IDs (an edge belongs to
    its destination's part)."""
    part: np.ndarray  # original node ID -> part
    orig_nids: np.ndarray  # new node ID -> original
    new_nids: np.ndarray  # original node ID -> new
    node_starts: np.ndarray
    dst_part: np.ndarray  # edge -> part
    edge_starts: np.ndarray

    @classmethod
    def of(cls, assignment: np.ndarray, dst: np.ndarray, num_parts: int) -> "Layout":
        part = assignment.astype(np.int8 if num_parts < 128 else np.int32)
        orig_nids = np.argsort(part, kind="stable")
        new_nids = np.empty(len(part), np.int64)
        new_nids[orig_nids] = np.arange(len(part))
        dst_part = part[dst]
        starts = [np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=num_parts))]) for ids in (part, dst_part)]
        return cls(part, orig_nids, new_nids, starts[0], dst_part, starts[1])


def build(graph_file: Path, assignment: np.ndarray, out: Path, graph_name: str,
          num_parts: int, part_method: str, builders: int = 1) -> dict[str, Any]:
    """Write the parts on this host, `builders` at a time (threads: numpy and DGL release the GIL for their
    work on whole arrays); return the manifest's counts and edge cut."""
    import dgl

    (graph,), _ = dgl.load_graphs(str(graph_file))
    src, dst = (ids.numpy() for ids in graph.edges())
    ndata = {name: tensor.numpy() for name, tensor in graph.ndata.items()}
    edata = {name: tensor.numpy() for name, tensor in graph.edata.items()}
    del graph
    layout = Layout.of(assignment, dst, num_parts)

    def build_one(p: int) -> dict[str, int]:
        return build_part(out, p, layout, src, dst, lambda owned: {name: array[owned] for name, array in ndata.items()},
                          lambda inner: {name: array[inner] for name, array in edata.items()})

    PROGRESS.phase(f"build the parts, {builders} at a time", total=num_parts, unit="parts")
    with ThreadPoolExecutor(builders) as pool:
        parts = []
        for part in pool.map(build_one, range(num_parts)):  # in order: a line may count a part late, never early
            parts.append(part)
            PROGRESS.step(len(parts))
    PROGRESS.phase("write the ID mappings and config")
    return finish(out, layout, src, graph_name, part_method, parts)


def build_part(out: Path, p: int, layout: Layout, src: np.ndarray, dst: np.ndarray,
               node_rows: Callable[[np.ndarray], dict[str, np.ndarray]],
               edge_rows: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None) -> dict[str, int]:
    """Write part p (owned nodes, their in-edges and, as partition_graph does for one hop, the owned nodes'
    out-edges into other parts, marked not inner; halo nodes: the other ends of both) and return its counts.
    node_rows(owned) gives every node data's rows of the owned nodes (sorted original IDs), edge_rows(inner)
    every edge data's rows of the inner edges (sorted original IDs; none without it): written first, so that
    they are not held beside the graph."""
    part_dir = out / f"part{p}"
    part_dir.mkdir()
    owned = layout.orig_nids[layout.node_starts[p]:layout.node_starts[p + 1]]
    rows = {f"_N/{name}": array for name, array in node_rows(owned).items()}
    train_nodes = write_node_data(part_dir, rows)
    del rows
    num_nodes = len(layout.part)
    inner_eids = np.flatnonzero(layout.dst_part == p)
    # partition_graph's edge data of a part: its inner edges', in new-ID order (the original order here).
    write_edge_data(part_dir, {f"_N:_E:_N/{name}": array
                               for name, array in (edge_rows(inner_eids) if edge_rows else {}).items()})
    outer_eids = np.flatnonzero((layout.dst_part != p) & (layout.part[src] == p))
    member = np.zeros(num_nodes, bool)
    member[owned] = True
    # One hop, as partition_graph keeps it: the sources of the owned nodes' in-edges and the destinations of
    # their out-edges (the same nodes when every edge has its reverse).
    member[src[inner_eids]] = True
    member[dst[outer_eids]] = True
    halo = np.sort(layout.new_nids[np.flatnonzero(member & (layout.part != p))])
    write_graph(part_dir, p, owned, halo, inner_eids, outer_eids, src, dst, layout)
    return {"part": p, "nodes": len(owned), "edges": len(inner_eids), "train_nodes": train_nodes,
            "halo_nodes": len(halo)}


def finish(out: Path, layout: Layout, src: np.ndarray, graph_name: str, part_method: str,
           parts: list[dict[str, int]]) -> dict[str, Any]:
    """The ID mappings and the partition config once every part is written; return the manifest's counts
    and edge cut."""
    num_parts, num_nodes, num_edges = len(parts), len(layout.part), len(layout.dst_part)
    node_starts, edge_starts = layout.node_starts, layout.edge_starts
    # orig_eids.npy (new edge ID -> original) part by part, without a whole-graph argsort.
    with open(out / "orig_eids.npy", "wb") as eid_file:
        np.lib.format.write_array_header_1_0(eid_file, {"descr": "<i8", "fortran_order": False,
                                                        "shape": (num_edges,)})
        for p in range(num_parts):
            np.flatnonzero(layout.dst_part == p).tofile(eid_file)
    np.save(out / "orig_nids.npy", layout.orig_nids)
    write_config(out, graph_name, part_method, node_starts, edge_starts)
    cut = int(np.count_nonzero(layout.part[src] != layout.dst_part))
    return {"num_nodes": num_nodes, "num_edges": num_edges, "parts": parts,
            "edge_cut": {"count": cut, "fraction": round(cut / max(num_edges, 1), 6)}}


def write_config(out: Path, graph_name: str, part_method: str, node_starts: np.ndarray, edge_starts: np.ndarray,
                 node_types: tuple[str, ...] | list[str] = ("_N",), edge_types: tuple[str, ...] | list[str] = ("_N:_E:_N",)
                 ) -> None:
    """<graph>.json, partition_graph's config: part p owns new node IDs node_starts[p * T + t] ..
    node_starts[p * T + t + 1] - 1 of type t (T node types: a part's nodes type by type, as partition_graph lays
    heterogeneous parts out; one type, `_N`, for a homogeneous graph), and its edges likewise by edge type."""
    def ranges(starts: np.ndarray, types: tuple[str, ...] | list[str]) -> dict[str, list[list[int]]]:
        count = len(types)
        return {name: [[int(starts[p * count + t]), int(starts[p * count + t + 1])] for p in range(num_parts)]
                for t, name in enumerate(types)}

    num_parts = (len(node_starts) - 1) // len(node_types)
    config: dict[str, Any] = {
        "graph_name": graph_name, "num_nodes": int(node_starts[-1]), "num_edges": int(edge_starts[-1]),
        "part_method": part_method, "num_parts": num_parts, "halo_hops": 1,
        "node_map": ranges(node_starts, node_types), "edge_map": ranges(edge_starts, edge_types),
        "ntypes": {name: t for t, name in enumerate(node_types)}, "etypes": {name: t for t, name in enumerate(edge_types)},
        **{f"part-{p}": {"node_feats": f"part{p}/node_feat.dgl", "edge_feats": f"part{p}/edge_feat.dgl",
                         "part_graph": f"part{p}/graph.dgl"} for p in range(num_parts)}}
    with open(out / f"{graph_name}.json", "w") as f:
        json.dump(config, f, indent=4)


def write_graph(part_dir: Path, p: int, owned: np.ndarray, halo: np.ndarray, inner_eids: np.ndarray,
                outer_eids: np.ndarray, src: np.ndarray, dst: np.ndarray, layout: Layout) -> None:
    """One part's graph.dgl: inner edges, then the outer ones. `halo` holds new node IDs."""
    orig_nids, part, dst_part, edge_starts = layout.orig_nids, layout.part, layout.dst_part, layout.edge_starts
    node_start = int(layout.node_starts[p])
    halo_orig = orig_nids[halo]
    # Local IDs: owned nodes in new-ID order, then halo nodes in new-ID order.
    local = np.full(len(orig_nids), -1, np.int64)
    local[owned] = np.arange(len(owned))
    local[halo_orig] = len(owned) + np.arange(len(halo))
    # New IDs of other parts' edges: their rank among their part's edges, which keep the original order.
    outer_new = np.empty(len(outer_eids), np.int64)
    outer_part = dst_part[outer_eids]
    for q in np.unique(outer_part):
        which = outer_part == q
        outer_new[which] = edge_starts[q] + np.searchsorted(np.flatnonzero(dst_part == q), outer_eids[which])
    order = np.argsort(outer_new)
    outer_eids, outer_new = outer_eids[order], outer_new[order]
    num_inner = len(inner_eids)
    new_eids = np.empty(num_inner + len(outer_eids), np.int64)
    new_eids[:num_inner] = np.arange(edge_starts[p], edge_starts[p] + num_inner)
    new_eids[num_inner:] = outer_new
    # The ends' local IDs, gathered a slice at a time (no whole-part temporaries).
    ends = np.empty((2, len(new_eids)), np.int64)
    step = 1 << 22
    for offset, eids in ((0, inner_eids), (num_inner, outer_eids)):
        for begin in range(0, len(eids), step):
            chunk = eids[begin:begin + step]
            ends[:, offset + begin:offset + begin + len(chunk)] = local[src[chunk]], local[dst[chunk]]
    del local
    save_part_graph(part_dir, p, node_start, len(owned), halo, part[halo_orig], ends, new_eids, num_inner)


def write_node_data(part_dir: Path, rows: dict[str, np.ndarray]) -> int:
    """A part's node_feat.dgl (every node data's rows of its owned nodes of its type, in new-ID order, under
    DGL's key `<node type>/<name>`); return the part's training nodes."""
    save_data(part_dir / "node_feat.dgl", rows)
    return sum(int(np.count_nonzero(array)) for key, array in rows.items() if key.endswith("/train_mask"))


def write_edge_data(part_dir: Path, rows: dict[str, np.ndarray]) -> None:
    """A part's edge_feat.dgl, as partition_graph writes it: every edge data's rows of the part's inner edges
    (the in-edges of its nodes) of its type, in new-ID order, under DGL's key `<src:rel:dst>/<name>`
    (`_N:_E:_N/<name>` for a homogeneous graph); empty for a graph without edge data."""
    save_data(part_dir / "edge_feat.dgl", rows)


def save_data(path: Path, rows: dict[str, np.ndarray]) -> None:
    import torch
    from dgl.data.utils import save_tensors

    save_tensors(str(path), {key: torch.from_numpy(array) for key, array in rows.items()})


def save_part_graph(part_dir: Path, p: int, node_start: int, num_owned: int, halo: np.ndarray, halo_parts: np.ndarray,
                    ends: np.ndarray, new_eids: np.ndarray, num_inner: int,
                    types: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """One part's graph.dgl as partition_graph writes it: local nodes are the owned ones (new IDs node_start ..
    node_start + num_owned - 1), then the halo nodes (`halo`: new IDs, sorted; `halo_parts`: their parts); `ends`
    (2 x edges, local IDs) holds the `num_inner` in-edges of owned nodes, then the edges into halo nodes. A
    heterogeneous graph's part also has each local node's and edge's type (`types`: their places in the config's
    ntypes and etypes) as `_TYPE`, int32 as partition_graph saves it."""
    import dgl
    import torch

    graph = dgl.graph((torch.from_numpy(ends[0]), torch.from_numpy(ends[1])), num_nodes=num_owned + len(halo),
                      idtype=torch.int64)
    graph.ndata[dgl.NID] = torch.from_numpy(np.concatenate([np.arange(node_start, node_start + num_owned), halo]))
    graph.ndata["inner_node"] = torch.from_numpy(
        np.concatenate([np.ones(num_owned, np.uint8), np.zeros(len(halo), np.uint8)]))
    graph.ndata["part_id"] = torch.from_numpy(
        np.concatenate([np.full(num_owned, p, np.int64), halo_parts.astype(np.int64)]))
    graph.edata[dgl.EID] = torch.from_numpy(new_eids)
    graph.edata["inner_edge"] = torch.from_numpy(
        np.concatenate([np.ones(num_inner, np.uint8), np.zeros(len(new_eids) - num_inner, np.uint8)]))
    if types is not None:
        graph.ndata[dgl.NTYPE] = torch.from_numpy(types[0].astype(np.int32))
        graph.edata[dgl.ETYPE] = torch.from_numpy(types[1].astype(np.int32))
    dgl.save_graphs(str(part_dir / "graph.dgl"), [graph])


if __name__ == "__main__":
    if sys.argv[1:2] != ["assign"]:
        sys.exit("usage: python -m dglkit.leanpart assign ...")
    sys.exit(assign_main(sys.argv[2:]))

"""The lean builder of `dglkit partition`: DGL's partition format for a homogeneous graph with a fraction of
the memory of `dgl.distributed.partition_graph`.

partition_graph keeps the input graph, its homogeneous copy, METIS' symmetric copy, the reshuffled graph and
every part with its halo in memory at once (about 215 bytes per edge). Here:
1. a child process (`python -m dglkit.leanpart assign`) reads the structure, builds the symmetric graph METIS
   needs without self loops or duplicate pairs, runs DGL's METIS with partition_graph's weights (training
   nodes and in-degrees balanced) and saves the assignment; its memory is returned when it exits;
2. this process reads the graph once and writes one part at a time: the part's owned nodes renumbered to a
   contiguous range, the in-edges of owned nodes (renumbered to a contiguous range too) and, as
   partition_graph does for one hop, the owned nodes' edges into halo nodes, marked not inner.
The files are the ones partition_graph writes (graph.dgl with _ID/inner_node/part_id and _ID/inner_edge,
node_feat.dgl, edge_feat.dgl, <graph>.json); DistGraph and dgl_partition_to_graphbolt read them unchanged.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np


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


def undirected_pairs(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Each distinct non-loop edge once, as low * num_nodes + high, sorted."""
    keys = np.empty(len(src), np.int64)
    step = 1 << 24  # in slices, so that the temporaries stay small
    for begin in range(0, len(src), step):
        s, d = src[begin:begin + step], dst[begin:begin + step]
        keys[begin:begin + step] = np.minimum(s, d) * num_nodes + np.maximum(s, d)
        keys[begin:begin + step][s == d] = -1
    keys.sort()
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
    by_high = np.argsort(high, kind="stable")
    starts_high = np.cumsum(from_high) - from_high
    step = 1 << 24
    for begin in range(0, len(pairs), step):
        rank = np.arange(begin, min(begin + step, len(pairs)))
        v = low[begin:begin + step]
        indices[indptr[v] + rank - starts_low[v]] = high[begin:begin + step]
        order = by_high[begin:begin + step]
        v = high[order]
        indices[indptr[v] + from_low[v] + rank - starts_high[v]] = low[order]
    del low, high, by_high
    return dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.zeros(0, dtype=torch.int64))),
                     num_nodes=num_nodes, idtype=torch.int64)


def metis_assignment(graph_file: Path, num_parts: int, balance_train: bool, balance_edges: bool) -> np.ndarray:
    """partition_graph's METIS call (same vertex weights, same options) on a compact symmetric graph."""
    import dgl
    import torch
    from dgl.partition import _CAPI_DGLMetisPartition_Hetero

    (graph,), _ = dgl.load_graphs(str(graph_file))
    num_nodes = graph.num_nodes()
    weights = []
    if balance_train:
        train = graph.ndata["train_mask"].numpy().astype(bool)
        weights += [~train, train]
    if balance_edges:
        weights.append(graph.in_degrees().numpy())
    src, dst = (ids.numpy() for ids in graph.edges())
    vwgt = np.stack(weights, 1).astype(np.int64).reshape(-1) if weights else np.zeros(0, np.int64)
    del graph, weights
    pairs = undirected_pairs(src, dst, num_nodes)
    del src, dst
    sym = symmetric_graph(pairs, num_nodes)
    del pairs
    parts = _CAPI_DGLMetisPartition_Hetero(sym._graph, num_parts, dgl.backend.to_dgl_nd(torch.from_numpy(vwgt)),
                                           "k-way", True)
    return dgl.backend.zerocopy_from_dgl_ndarray(parts).numpy()


def assign_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m dglkit.leanpart assign")
    parser.add_argument("--graph", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--num-parts", required=True, type=int)
    parser.add_argument("--method", choices=("metis", "random"), default="metis")
    parser.add_argument("--no-balance-train", dest="balance_train", action="store_false")
    parser.add_argument("--no-balance-edges", dest="balance_edges", action="store_false")
    args = parser.parse_args(argv)
    if args.method == "metis" and args.num_parts > 1:
        parts = metis_assignment(args.graph, args.num_parts, args.balance_train, args.balance_edges)
    else:
        import dgl

        num_nodes = dgl.load_graphs(str(args.graph))[0][0].num_nodes()
        parts = np.random.default_rng(0).integers(0, args.num_parts, num_nodes)
    np.save(args.out, parts.astype(np.int32))
    return 0


def build(graph_file: Path, assignment: np.ndarray, out: Path, graph_name: str,
          num_parts: int, part_method: str) -> dict[str, Any]:
    """Write the parts one at a time; return the manifest's counts and edge cut."""
    import dgl

    (graph,), _ = dgl.load_graphs(str(graph_file))
    num_nodes, num_edges = graph.num_nodes(), graph.num_edges()
    src, dst = (ids.numpy() for ids in graph.edges())
    ndata = {name: tensor for name, tensor in graph.ndata.items()}
    del graph

    part = assignment.astype(np.int8 if num_parts < 128 else np.int32)
    orig_nids = np.argsort(part, kind="stable")  # new node ID -> original; parts get contiguous ranges
    new_nids = np.empty(num_nodes, np.int64)
    new_nids[orig_nids] = np.arange(num_nodes)
    node_counts = np.bincount(part, minlength=num_parts)
    node_starts = np.concatenate([[0], np.cumsum(node_counts)])
    dst_part = part[dst]  # an edge belongs to the part of its destination
    edge_counts = np.bincount(dst_part, minlength=num_parts)
    edge_starts = np.concatenate([[0], np.cumsum(edge_counts)])
    train = ndata["train_mask"].numpy().astype(bool) if "train_mask" in ndata else np.zeros(num_nodes, bool)

    config: dict[str, Any] = {
        "graph_name": graph_name, "num_nodes": num_nodes, "num_edges": num_edges, "part_method": part_method,
        "num_parts": num_parts, "halo_hops": 1,
        "node_map": {"_N": [[int(a), int(b)] for a, b in zip(node_starts[:-1], node_starts[1:])]},
        "edge_map": {"_N:_E:_N": [[int(a), int(b)] for a, b in zip(edge_starts[:-1], edge_starts[1:])]},
        "ntypes": {"_N": 0}, "etypes": {"_N:_E:_N": 0}}
    parts = []
    # orig_eids.npy is written part by part: new edge ID -> original edge ID.
    with open(out / "orig_eids.npy", "wb") as eid_file:
        np.lib.format.write_array_header_1_0(eid_file, {"descr": "<i8", "fortran_order": False,
                                                        "shape": (num_edges,)})
        for p in range(num_parts):
            inner_eids = np.flatnonzero(dst_part == p)
            inner_eids.tofile(eid_file)
            owned = orig_nids[node_starts[p]:node_starts[p + 1]]
            member = np.zeros(num_nodes, bool)
            member[owned] = True
            member[src[inner_eids]] = True  # one hop: the sources of the owned nodes' in-edges
            halo = np.sort(new_nids[np.flatnonzero(member & (part != p))])
            # As partition_graph does, keep the owned nodes' edges into halo nodes too, marked not inner.
            outer_eids = np.flatnonzero((dst_part != p) & member[dst] & (part[src] == p))
            write_part(out / f"part{p}", p, owned, halo, inner_eids, outer_eids, src, dst, dst_part,
                       orig_nids, part, int(node_starts[p]), edge_starts, ndata)
            parts.append({"part": p, "nodes": int(node_counts[p]), "edges": int(edge_counts[p]),
                          "train_nodes": int(np.count_nonzero(train[owned])), "halo_nodes": len(halo)})
            config[f"part-{p}"] = {"node_feats": f"part{p}/node_feat.dgl", "edge_feats": f"part{p}/edge_feat.dgl",
                                   "part_graph": f"part{p}/graph.dgl"}
    np.save(out / "orig_nids.npy", orig_nids)
    cut = int(np.count_nonzero(part[src] != dst_part))
    with open(out / f"{graph_name}.json", "w") as f:
        json.dump(config, f, indent=4)
    return {"num_nodes": num_nodes, "num_edges": num_edges, "parts": parts,
            "edge_cut": {"count": cut, "fraction": round(cut / max(num_edges, 1), 6)}}


def write_part(part_dir: Path, p: int, owned: np.ndarray, halo: np.ndarray, inner_eids: np.ndarray,
               outer_eids: np.ndarray, src: np.ndarray, dst: np.ndarray, dst_part: np.ndarray,
               orig_nids: np.ndarray, part: np.ndarray, node_start: int, edge_starts: np.ndarray,
               ndata: dict) -> None:
    """One part's graph.dgl, node_feat.dgl and (empty) edge_feat.dgl. `halo` holds new node IDs."""
    import dgl
    import torch
    from dgl.data.utils import save_tensors

    part_dir.mkdir()
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
    eids = np.concatenate([inner_eids, outer_eids])
    graph = dgl.graph((torch.from_numpy(local[src[eids]]), torch.from_numpy(local[dst[eids]])),
                      num_nodes=len(owned) + len(halo), idtype=torch.int64)
    del eids, local
    graph.ndata[dgl.NID] = torch.from_numpy(np.concatenate([np.arange(node_start, node_start + len(owned)), halo]))
    graph.ndata["inner_node"] = torch.from_numpy(
        np.concatenate([np.ones(len(owned), np.uint8), np.zeros(len(halo), np.uint8)]))
    graph.ndata["part_id"] = torch.from_numpy(
        np.concatenate([np.full(len(owned), p, np.int64), part[halo_orig].astype(np.int64)]))
    inner_new = np.arange(edge_starts[p], edge_starts[p] + len(inner_eids))
    graph.edata[dgl.EID] = torch.from_numpy(np.concatenate([inner_new, outer_new]))
    graph.edata["inner_edge"] = torch.from_numpy(
        np.concatenate([np.ones(len(inner_eids), np.uint8), np.zeros(len(outer_eids), np.uint8)]))
    dgl.save_graphs(str(part_dir / "graph.dgl"), [graph])
    del graph
    index = torch.from_numpy(owned)
    save_tensors(str(part_dir / "node_feat.dgl"), {f"_N/{name}": tensor[index] for name, tensor in ndata.items()})
    save_tensors(str(part_dir / "edge_feat.dgl"), {})


if __name__ == "__main__":
    if sys.argv[1:2] != ["assign"]:
        sys.exit("usage: python -m dglkit.leanpart assign ...")
    sys.exit(assign_main(sys.argv[2:]))

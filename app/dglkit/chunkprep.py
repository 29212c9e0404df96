"""`dglkit prepare --dataset chunked --path DIR --out OUT`: OUT/dataset.json describing the user's graph in DGL's
chunked format (dglkit.chunked), which stays where it is; nothing of the graph is copied or built. With --whole,
for the single-host builders, OUT/graph.dgl holds the graph read whole (dglkit.chunkwhole) and dataset.json
describes it as `prepare` describes any other graph.dgl.

The fingerprint covers metadata.json's text and every chunk file's size and modification time: a re-run with
the same files is a no-op, a changed chunk makes another fingerprint (and another partition). Only the
labelled type's labels and masks are read, one chunk at a time (for num_classes and num_train|val|test); the
feature dimensions come from the .npy headers. The kit's trainers read the node data `feat`, `labels`,
`train_mask`, `val_mask`, `test_mask`; labels and masks, when given, are on one node type (the category).
"""

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from dglkit import chunked, chunkwhole, graphfile
from dglkit.common import UserError, digest, emit_result, peak_rss_mb, read_json, write_json

FORMAT = 1  # bump when the same files would be described differently
MASKS = ("train_mask", "val_mask", "test_mask")


def run(args: argparse.Namespace) -> int:
    if args.path is None:
        raise UserError("--dataset chunked needs --path: the directory holding the graph's metadata.json")
    if args.val_edges_frac or args.test_edges_frac or (args.arrays and not args.whole):
        raise UserError("--dataset chunked is described where it is, not built whole: --arrays needs --whole, and "
                        "held-out edges (--val-edges-frac, --test-edges-frac) are not drawn from it; write them "
                        "into the chunks instead")
    root: Path = args.path.resolve()
    graph = chunked.load(root)
    if args.arrays and graph.heterogeneous:
        raise UserError("--arrays (for `partition --builder distributed`) works on homogeneous graphs only")
    whole = {"whole": True, "arrays": args.arrays} if args.whole else {}
    fingerprint = digest({"format": FORMAT, "source": "chunked", "inputs": inputs(graph), **whole})
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    old = read_json(out / "dataset.json")
    if old and old.get("fingerprint") == fingerprint and (not args.whole or graphfile.is_current(out, old)):
        emit_result({"changed": False, "out": str(out), **summary(old)})
        return 0
    start = time.perf_counter()
    described = describe(graph)
    if args.whole:
        chunkwhole.check_memory(described, out, args.memory_gb)
    meta = {"source": "chunked", "path": str(root), "graph_name": graph.graph_name, "fingerprint": fingerprint,
            **described}
    out.mkdir(parents=True, exist_ok=True)
    meta.update(write_whole(graph, out, args) if args.whole else {"format": "chunked"})
    meta.update(seconds=round(time.perf_counter() - start, 2), peak_rss_mb=round(peak_rss_mb()))
    write_json(out / "dataset.json", meta)
    emit_result({"changed": True, "out": str(out), **summary(meta)})
    return 0


def write_whole(graph: chunked.ChunkedGraph, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """graph.dgl (and with --arrays, arrays/) of the graph read whole; dataset.json's fields for them."""
    return graphfile.save(chunkwhole.read_graph(graph), out, args.arrays)


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    keys = ("fingerprint", "num_nodes", "num_edges", "num_classes", "seconds", "peak_rss_mb")
    return {key: meta.get(key) for key in keys}


def inputs(graph: chunked.ChunkedGraph) -> dict[str, Any]:
    """What identifies the graph's files: metadata.json's text and each file's size and mtime."""
    stats = {}
    for path in [graph.root / chunked.METADATA, *graph.files()]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise UserError(f"{path} is missing (metadata.json lists it): write the chunk or correct the path") from None
        stats[str(path.relative_to(graph.root)) if path.is_relative_to(graph.root) else str(path)] = [
            st.st_size, st.st_mtime_ns]
    return {"path": str(graph.root), "metadata": digest((graph.root / chunked.METADATA).read_text()), "files": stats}


def describe(graph: chunked.ChunkedGraph) -> dict[str, Any]:
    """dataset.json's fields, with hetero.describe's names so that the kit reads both alike."""
    labelled = [t for t, names in graph.node_data.items() if "labels" in names]
    if len(labelled) > 1:
        raise UserError(f"{graph.root / chunked.METADATA}: node_data gives labels on {labelled}; the kit trains on one "
                        "labelled node type: keep labels on one")
    category = labelled[0] if labelled else None
    dims = {t: feat_dim(graph, t) for t in graph.node_types}
    described: dict[str, Any] = {
        "heterogeneous": graph.heterogeneous, "num_nodes": sum(graph.num_nodes.values()),
        "num_edges": sum(graph.num_edges.values()), "num_chunks": graph.num_chunks,
        "feat_dim": dims[category or graph.node_types[0]],
        "node_types": {t: {"num_nodes": graph.num_nodes[t], "feat_dim": dims[t]} for t in graph.node_types},
        "edge_types": dict(graph.num_edges),
    }
    if category:
        described.update(category=category, **label_counts(graph, category))
    return described


def feat_dim(graph: chunked.ChunkedGraph, ntype: str) -> int:
    """The width of a type's `feat` from chunk 0's header (0: featureless)."""
    files = graph.node_data.get(ntype, {}).get("feat")
    if not files:
        return 0
    _, row_shape = chunked.data_header(files[0], graph.formats[files[0]])
    return int(np.prod(row_shape)) if row_shape else 1


def label_counts(graph: chunked.ChunkedGraph, ntype: str) -> dict[str, int]:
    """num_classes (labels < 0: unlabelled nodes) and, with masks, num_train|val|test; one chunk in memory."""
    names = graph.node_data[ntype]
    masks = [name for name in MASKS if name in names]
    if masks and len(masks) < len(MASKS):
        raise UserError(f"{graph.root / chunked.METADATA}: {ntype} has {masks} but not all of {', '.join(MASKS)}: "
                        "give all three masks or none")
    top, counts = -1, dict.fromkeys(masks, 0)
    for chunk in range(len(graph.node_chunks[ntype])):
        labels = chunked.read_node_data(graph, ntype, "labels", chunk)
        if not np.issubdtype(labels.dtype, np.integer) or labels.ndim != 1:
            raise UserError(f"{graph.node_data[ntype]['labels'][chunk]}: labels must be one integer class id per node "
                            f"(negative: unlabelled), got {labels.dtype} {labels.shape}")
        top = max(top, int(labels.max()) if len(labels) else -1)
        for name in masks:
            counts[name] += int(np.count_nonzero(chunked.read_node_data(graph, ntype, name, chunk)))
    if top < 0:
        raise UserError(f"{graph.root / chunked.METADATA}: {ntype}'s labels hold no class id >= 0")
    return {"num_classes": top + 1, **{f"num_{name[:-5]}": count for name, count in counts.items()}}

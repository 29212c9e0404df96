"""A prepared dataset's graph.dgl and, for `partition --builder distributed`, the same graph as arrays/: written so
that dataset.json never describes another graph than the one beside it."""

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from dglkit.progress import PROGRESS

ARRAYS = "arrays"


def file_bytes(num_nodes: int, num_edges: int, feat_dim: int) -> int:
    """About what graph.dgl takes on disk: int64 ends per edge, float32 features, labels and masks per node."""
    return 16 * num_edges + num_nodes * (4 * feat_dim + 11)


def is_current(out: Path, meta: dict[str, Any] | None) -> bool:
    """Whether out/graph.dgl is the file dataset.json (meta) describes: there, with the size it recorded."""
    graph_file = out / "graph.dgl"
    return meta is not None and graph_file.is_file() and graph_file.stat().st_size == meta.get("graph_bytes")


def save(graph, out: Path, arrays: bool) -> dict[str, Any]:
    """out/graph.dgl (with `arrays`, out/arrays/ too) in place of earlier ones, dataset.json removed first (never an
    old fingerprint next to a new graph, even after a crash); dataset.json's fields for them."""
    import dgl

    PROGRESS.phase("save graph.dgl")
    tmp, graph_file = out / "graph.dgl.tmp", out / "graph.dgl"
    dgl.save_graphs(str(tmp), [graph])
    (out / "dataset.json").unlink(missing_ok=True)
    shutil.rmtree(out / ARRAYS, ignore_errors=True)
    os.replace(tmp, graph_file)
    if arrays:
        write_arrays(graph, out / ARRAYS)
    return {"graph_file": graph_file.name, "graph_bytes": graph_file.stat().st_size,
            **({"arrays": {"dir": ARRAYS, "node_data": list(graph.ndata), "edge_data": list(graph.edata)}}
               if arrays else {})}


def write_arrays(graph, directory: Path) -> None:
    """src.npy, dst.npy, node_<name>.npy per node data and edge_<name>.npy per edge data, with the dtypes
    graph.dgl loads as (masks as 0/1 uint8), so that a part built from them equals one built from graph.dgl."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files = {f"{name}.npy": ids for name, ids in zip(("src", "dst"), graph.edges())}
    files.update({f"node_{name}.npy": tensor for name, tensor in graph.ndata.items()})
    files.update({f"edge_{name}.npy": tensor for name, tensor in graph.edata.items()})
    PROGRESS.phase("write arrays/", total=len(files), unit="arrays")
    for done, (name, tensor) in enumerate(files.items(), 1):
        array = tensor.numpy()
        np.save(tmp / name, array.astype(np.uint8) if array.dtype == bool else array)
        PROGRESS.step(done)
    os.replace(tmp, directory)

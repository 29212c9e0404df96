"""GraphBolt's sampling graph of one part of a DGL partition, written beside the part's graph.dgl by the rank
that built it (dglkit.mpibuild --graphbolt): the file `dgl_partition_to_graphbolt` writes for that part with
its defaults, which loads every part, one after the other, in one process on one host.

A homogeneous part: the CSC of all its edges (owned nodes' in-edges and the edges into its halo nodes) with
each local node's original ID (`_ID`) as its only attribute; indptr and indices in the smallest integer type
that holds the part's edge and node counts, IDs in int64, as DGL casts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

FILE = "fused_csc_sampling_graph.pt"
INT32_MAX = np.iinfo(np.int32).max


def convert(part_dir: Path) -> None:
    """Write part_dir/fused_csc_sampling_graph.pt from part_dir/graph.dgl."""
    import dgl
    import torch
    from dgl import graphbolt

    graph = dgl.load_graphs(str(part_dir / "graph.dgl"))[0][0]
    indptr, indices, _ = graph.adj_tensors("csc")
    sampling_graph = graphbolt.fused_csc_sampling_graph(
        smallest(indptr, graph.num_edges()), smallest(indices, graph.num_nodes()),
        node_attributes={dgl.NID: graph.ndata[dgl.NID].to(torch.int64)}, edge_attributes={})
    torch.save(sampling_graph, part_dir / FILE)


def smallest(ids: torch.Tensor, bound: int) -> torch.Tensor:
    """ids as int32 when every value up to `bound` fits below int32's largest value, else as int64."""
    import torch

    return ids.to(torch.int32 if bound < INT32_MAX else torch.int64)


def add_to_config(part_config: Path) -> None:
    """Point each part's entry at its GraphBolt graph, as dgl_partition_to_graphbolt leaves the config."""
    config = json.loads(part_config.read_text())
    for part in range(config["num_parts"]):
        entry = config[f"part-{part}"]
        entry["part_graph_graphbolt"] = str(Path(entry["part_graph"]).parent / FILE)
    config.update(node_map_dtype="int64", edge_map_dtype="int64")
    part_config.write_text(json.dumps(config, indent=4))  # as leanpart.write_config wrote it

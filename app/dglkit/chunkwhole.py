"""`dglkit prepare --dataset chunked --path DIR --whole`: a graph in DGL's chunked format read whole into graph.dgl,
for the single-host builders (lean, dgl, distributed) when it fits the storage host.

The graph is the chunks as given: no reverse edges added, node data under its own names and dtypes, homogeneous
or heterogeneous (one DGL type per metadata type), so that a partition of it and the mpi builder's partition of
the same chunks are partitions of one graph. Edge data goes on its edges (g.edges[etype].data; a homogeneous graph's
g.edata), which the lean builder and partition_graph carry as the mpi builder does.
"""

from pathlib import Path
from typing import Any

import numpy as np

from dglkit import chunked, graphfile
from dglkit.progress import PROGRESS
from dglkit.resources import check_fits, memory_estimate


def check_memory(described: dict[str, Any], out: Path, memory_gb: float | None) -> None:
    """Refuse, before reading a chunk, a graph whose whole read does not fit this host."""
    nodes, edges, feat_dim = described["num_nodes"], described["num_edges"], described["feat_dim"]
    check_fits(f"reading the chunked graph whole ({nodes} nodes, {edges} edges)",
               memory_estimate("prepare", nodes, edges, feat_dim), graphfile.file_bytes(nodes, edges, feat_dim), out,
               memory_gb, ways_out="partition it without reading it whole (dgl_job_partition_builder: mpi), or "
               "prepare on a storage host with more memory")


def read_graph(graph: chunked.ChunkedGraph):
    """The DGL graph of every chunk, read one file at a time (each checked as `chunked check` checks it)."""
    import dgl
    import torch

    files = len(graph.edge_types) + sum(len(names) for data in (graph.node_data, graph.edge_data)
                                        for names in data.values())
    PROGRESS.phase("read the chunks whole", total=files, unit="arrays")
    edges = {}
    for etype in graph.edge_types:
        pairs = [chunked.read_edges(graph, etype, chunk) for chunk in range(len(graph.edge_chunks[etype]))]
        edges[tuple(etype.split(":"))] = tuple(torch.from_numpy(np.concatenate(side)) for side in zip(*pairs))
        PROGRESS.step(len(edges))
    if graph.heterogeneous:
        g = dgl.heterograph(edges, num_nodes_dict=graph.num_nodes, idtype=torch.int64)
    else:
        g = dgl.graph(next(iter(edges.values())), num_nodes=graph.num_nodes[graph.node_types[0]], idtype=torch.int64)
    done = len(edges)
    for kind, data in (("node", graph.node_data), ("edge", graph.edge_data)):
        for type_name, names in data.items():
            for name in names:
                data_of(g, kind, type_name)[name] = torch.from_numpy(whole_data(graph, kind, type_name, name))
                done += 1
                PROGRESS.step(done)
    return g


def data_of(g, kind: str, type_name: str):
    """The data of a node or edge type of g (kind: node, edge); of a homogeneous graph, g.ndata or g.edata (DGL
    names its one type _N, _N:_E:_N, whatever metadata.json calls it)."""
    if g.is_homogeneous:
        return g.ndata if kind == "node" else g.edata
    return g.nodes[type_name].data if kind == "node" else g.edges[tuple(type_name.split(":"))].data


def whole_data(graph: chunked.ChunkedGraph, kind: str, type_name: str, name: str) -> np.ndarray:
    """Node or edge data (kind: node, edge) of a type, every chunk's rows in order."""
    if kind == "node":
        return np.concatenate([chunked.read_node_data(graph, type_name, name, chunk)
                               for chunk in range(len(graph.node_chunks[type_name]))])
    return np.concatenate([chunked.read_edge_data(graph, type_name, name, chunk)
                           for chunk in range(len(graph.edge_chunks[type_name]))])

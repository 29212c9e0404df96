"""Heterogeneous graphs through the distributed partitioner: a graph in DGL's chunked format with three node
types (two with features, labels and masks on one) and three edge types (two with edge data), assigned by
dglkit.mpiassign and built by dglkit.mpibuild under a real mpirun on loopback, compared with what DGL's own partition_graph writes
for the same assignment."""

import json
from pathlib import Path

import dgl
import numpy as np
import pytest
import torch

from dglkit import chunked
from dglkit.mpiassign import load_assignment
from dglkit.resources import GB, mpi_rank_estimate
from localjob import build
from test_chunked import write_graph
from test_mpijob import HOSTS, dglkit
from test_mpipart import mpirun

# Sorted, as dgl.heterograph orders its types: the types' places (and so homogeneous IDs) are then DGL's too.
NODES = {"author": [30, 25], "paper": [40, 35, 30], "venue": [9]}
EDGES = {"author:writes:paper": 260, "paper:cites:paper": 300, "paper:published_in:venue": 105}


def write_hetero(root: Path) -> Path:
    """Random edges (self loops and duplicates among the citations), features on authors and papers, labels and
    masks on papers, edge data on citations (a weight) and on writes (rows of 6 bytes, which travel padded, and
    bytes); each edge type in two chunks, node types in one to three."""
    rng = np.random.default_rng(5)
    counts = {ntype: sum(chunks) for ntype, chunks in NODES.items()}
    edges = {}
    for etype, num in EDGES.items():
        src_type, _, dst_type = etype.split(":")
        edges[etype] = (rng.integers(0, counts[src_type], num).tolist(), rng.integers(0, counts[dst_type], num).tolist())
    papers = counts["paper"]
    draw = rng.random(papers)
    paper = {"feat": rng.standard_normal((papers, 4), dtype=np.float32), "labels": rng.integers(0, 3, papers),
             "train_mask": (draw < 0.5).astype(np.uint8), "val_mask": ((draw >= 0.5) & (draw < 0.7)).astype(np.uint8),
             "test_mask": (draw >= 0.7).astype(np.uint8)}
    author = {"feat": rng.standard_normal((counts["author"], 3), dtype=np.float32)}
    num_writes = EDGES["author:writes:paper"]
    edge_data = {"paper:cites:paper": {"weight": rng.random(EDGES["paper:cites:paper"], dtype=np.float32)},
                 "author:writes:paper": {"stamp": rng.standard_normal((num_writes, 3)).astype(np.float16),
                                         "order": rng.integers(0, 255, num_writes).astype(np.uint8)}}
    return write_graph(root, NODES, edges, {"author": author, "paper": paper}, edge_data)


@pytest.fixture(scope="module")
def hetero_chunked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hetero-chunked")
    write_hetero(directory / "chunks")
    build("prepare", "--dataset", "chunked", "--path", directory / "chunks", "--out", directory / "dataset")
    return directory / "dataset"


def dgl_graph(root: Path):
    """The chunked graph gathered on this host as a DGL heterograph, node and edge data on their types."""
    graph = chunked.load(root)
    edges = {}
    for etype in graph.edge_types:
        ends = [chunked.read_edges(graph, etype, c) for c in range(len(graph.edge_chunks[etype]))]
        edges[tuple(etype.split(":"))] = tuple(torch.from_numpy(np.concatenate(side)) for side in zip(*ends))
    g = dgl.heterograph(edges, num_nodes_dict=graph.num_nodes, idtype=torch.int64)
    for ntype, names in graph.node_data.items():
        for name in names:
            rows = [chunked.read_node_data(graph, ntype, name, c) for c in range(len(graph.node_chunks[ntype]))]
            g.nodes[ntype].data[name] = torch.from_numpy(np.concatenate(rows))
    for etype, names in graph.edge_data.items():
        for name in names:
            rows = [chunked.read_edge_data(graph, etype, name, c) for c in range(len(graph.edge_chunks[etype]))]
            g.edges[tuple(etype.split(":"))].data[name] = torch.from_numpy(np.concatenate(rows))
    return g


def dgl_partition(g, assignment: np.ndarray, out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict]:
    """partition_graph's parts of g for this assignment (homogeneous IDs, types in g's order): its random
    method draws the assignment through `random_choice`, which hands it this one instead."""
    import dgl.distributed.partition as dgl_partition_module

    monkeypatch.setattr(dgl_partition_module, "random_choice", lambda parts, nodes: torch.from_numpy(assignment))
    orig_nids, orig_eids = dgl.distributed.partition_graph(g, "graph", 2, str(out), part_method="random",
                                                           return_mapping=True)
    return ({ntype: ids.numpy() for ntype, ids in orig_nids.items()},
            {":".join(etype): ids.numpy() for etype, ids in orig_eids.items()})


def original_view(config: Path, part: int, orig_nids: dict[str, np.ndarray], orig_eids: dict[str, np.ndarray]
                  ) -> tuple[set, set, dict[str, np.ndarray]]:
    """Part `part` as DGL's loader and partition book read it, in original per-type IDs (partition_graph's order
    within a part and type is its sort's): local nodes as (type, ID, inner, part), local edges as (type, ID,
    source, destination, inner), source and destination as (type, ID); each node and edge data's rows (of the
    part's inner nodes and edges of its type) in original ID order."""
    g, feats, edge_feats, book, _, ntypes, etypes = dgl.distributed.load_partition(str(config), part)
    node_types, node_ids = (ids.numpy() for ids in book.map_to_per_ntype(g.ndata[dgl.NID]))
    assert (node_types == g.ndata[dgl.NTYPE].numpy()).all()
    orig = np.array([orig_nids[ntypes[t]][i] for t, i in zip(node_types, node_ids)])
    nodes = set(zip(node_types.tolist(), orig.tolist(), g.ndata["inner_node"].tolist(), g.ndata["part_id"].tolist()))
    edge_types, edge_ids = (ids.numpy() for ids in book.map_to_per_etype(g.edata[dgl.EID]))
    assert (edge_types == g.edata[dgl.ETYPE].numpy()).all()
    edge_orig = np.array([orig_eids[":".join(etypes[t])][i] for t, i in zip(edge_types, edge_ids)])
    src, dst = (list(zip(node_types[ends].tolist(), orig[ends].tolist())) for ends in (ids.numpy() for ids in g.edges()))
    edges = set(zip(edge_types.tolist(), edge_orig.tolist(), src, dst, g.edata["inner_edge"].tolist()))
    rows = {}
    for key, tensor in feats.items():
        ntype = key.split("/")[0]
        inner_orig = orig[(node_types == ntypes.index(ntype)) & (g.ndata["inner_node"].numpy() == 1)]
        rows[key] = tensor.numpy()[np.argsort(inner_orig)]
    for key, tensor in edge_feats.items():
        # Row i: the part's inner edge of its type with the i-th smallest new ID.
        inner = (edge_types == etypes.index(tuple(key.split("/")[0].split(":")))) & (g.edata["inner_edge"].numpy() == 1)
        inner_orig = edge_orig[inner][np.argsort(g.edata[dgl.EID].numpy()[inner])]
        rows[key] = tensor.numpy()[np.argsort(inner_orig)]
    return nodes, edges, rows


def test_a_heterogeneous_chunked_graph_partitions_as_partition_graph_does(hetero_chunked, tmp_path, monkeypatch):
    """Two ranks, small rounds (50 edges, and as many rows: the ranks' shares end at different rounds): the config
    (ID ranges per type, type maps), every part's nodes, halo nodes and edges, node types, edge types, node data
    and edge data (of its inner edges, under `<src:rel:dst>/<name>`; all by original ID, dtypes and row shapes as
    given) and the per-type ID mappings are those partition_graph writes for the same assignment; DGL's own checks
    of the parts pass."""
    mpirun(2, "mpiassign", "--dataset-dir", hetero_chunked, "--out", tmp_path / "assignment", "--num-parts", 2)
    mpirun(2, "mpibuild", "--dataset-dir", hetero_chunked, "--assignment", tmp_path / "assignment", "--out",
           tmp_path / "mpi", "--batch-edges", 50)
    g = dgl_graph(Path(json.loads((hetero_chunked / "dataset.json").read_text())["path"]))
    orig_nids, orig_eids = dgl_partition(g, load_assignment(tmp_path / "assignment").astype(np.int64),
                                         tmp_path / "dgl", monkeypatch)
    ours, theirs = (json.loads((tmp_path / name / "graph.json").read_text()) for name in ("mpi", "dgl"))
    keys = ("num_nodes", "num_edges", "num_parts", "halo_hops", "node_map", "edge_map", "ntypes", "etypes")
    assert {key: ours[key] for key in keys} == {key: theirs[key] for key in keys}
    assert list(ours["ntypes"]) == list(NODES) and list(ours["etypes"]) == list(EDGES)
    with np.load(tmp_path / "mpi" / "orig_nids.npz") as nids, np.load(tmp_path / "mpi" / "orig_eids.npz") as eids:
        mapped = ({ntype: nids[ntype] for ntype in nids.files}, {etype: eids[etype] for etype in eids.files})
    assert list(mapped[0]) == list(NODES) and list(mapped[1]) == list(EDGES)
    for ours_ids, dgl_ids, config_key in ((mapped[0], orig_nids, "node_map"), (mapped[1], orig_eids, "edge_map")):
        for name, ranges in ours[config_key].items():
            # Each part's IDs of each type are the same; partition_graph's order within them is its sort's.
            sizes = np.cumsum([0] + [end - begin for begin, end in ranges])
            for begin, end in zip(sizes[:-1], sizes[1:]):
                np.testing.assert_array_equal(np.sort(ours_ids[name][begin:end]), np.sort(dgl_ids[name][begin:end]))
    monkeypatch.setenv("DGL_DIST_DEBUG", "1")  # load_partition checks each part against the partition book
    for part in range(2):
        (nodes, edges, rows), (dgl_nodes, dgl_edges, dgl_rows) = (
            original_view(tmp_path / name / "graph.json", part, *mappings)
            for name, mappings in (("mpi", mapped), ("dgl", (orig_nids, orig_eids))))
        assert nodes == dgl_nodes and edges == dgl_edges and sorted(rows) == sorted(dgl_rows)
        assert {"paper:cites:paper/weight", "author:writes:paper/stamp", "author:writes:paper/order"} <= set(rows)
        for key, array in rows.items():
            assert array.dtype == dgl_rows[key].dtype and array.shape == dgl_rows[key].shape and len(array), key
            np.testing.assert_array_equal(array, dgl_rows[key])
        graphs = [dgl.load_graphs(str(tmp_path / name / f"part{part}" / "graph.dgl"))[0][0] for name in ("mpi", "dgl")]
        for kind in ("ndata", "edata"):
            assert [{key: value.dtype for key, value in getattr(graph, kind).items()} for graph in graphs[1:]] == [
                {key: value.dtype for key, value in getattr(graphs[0], kind).items()}]
        assert_in_edges_sorted_by_type(graphs[0])
    manifest = json.loads((tmp_path / "mpi" / "manifest.json").read_text())
    train = g.nodes["paper"].data["train_mask"].numpy().astype(bool)
    assert manifest["heterogeneous"] and sum(p["train_nodes"] for p in manifest["parts"]) == train.sum()


def assert_in_edges_sorted_by_type(g) -> None:
    """DGL's sampler of heterogeneous parts (etype_sorted) expects each node's in-edges in type order."""
    indptr, _, eids = (ids.numpy() for ids in g.adj_tensors("csc"))
    types = g.edata[dgl.ETYPE].numpy()[eids]
    row_starts = np.repeat(indptr[:-1], np.diff(indptr))
    later = np.arange(len(types)) > row_starts
    assert (types[later] >= np.concatenate([[0], types[:-1]])[later]).all()


def test_dglkit_mpi_runs_a_heterogeneous_graph_with_edge_data(hetero_chunked, tmp_path):
    """`dglkit mpi check` and `run`, as mpi.yml runs them on the workers: the heterogeneous graph with edge data is
    accepted (its memory check counts the edge data) and partitioned, and the parts' edge data, in the order of
    the per-type ID mappings, are the chunks' rows of those edges."""
    out = tmp_path / "part"
    args = ("--dataset-dir", hetero_chunked, "--out", out, "--num-parts", 2)
    dataset = json.loads((hetero_chunked / "dataset.json").read_text())
    widest = max(t["feat_dim"] for t in dataset["node_types"].values())
    sizes = (dataset["num_nodes"], dataset["num_edges"], max(dataset["feat_dim"], widest))
    # Two words an edge as the edge data travel: the writes' stamp (6 bytes) and order (1 byte), a word each.
    between = (mpi_rank_estimate(*sizes, 2) + mpi_rank_estimate(*sizes, 2, 2)) / 2 / GB
    proc = dglkit("mpi", "check", *args, "--memory-gb", between, check=False)
    assert proc.returncode == 2 and f"needs about {mpi_rank_estimate(*sizes, 2, 2) / GB:.1f} GB" in proc.stderr
    assert json.loads(dglkit("mpi", "check", *args).stdout.splitlines()[-1])["done"] is False
    dglkit("mpi", "run", "--dataset-dir", hetero_chunked, "--out", out, "--graph-name", "het", "--hosts", HOSTS)
    assert json.loads(dglkit("mpi", "check", *args).stdout.splitlines()[-1])["done"] is True
    config = json.loads((out / "het.json").read_text())
    assert list(config["ntypes"]) == list(NODES) and (out / "orig_nids.npz").is_file()
    assert not list(out.glob("orig_*.npy"))  # the per-type pieces went into the archives
    g = dgl_graph(Path(json.loads((hetero_chunked / "dataset.json").read_text())["path"]))
    feats = [dgl.data.utils.load_tensors(str(out / f"part{part}" / "edge_feat.dgl")) for part in range(2)]
    with np.load(out / "orig_eids.npz") as eids:
        for etype, name in (("paper:cites:paper", "weight"), ("author:writes:paper", "stamp")):
            rows = np.concatenate([part[f"{etype}/{name}"].numpy() for part in feats])
            np.testing.assert_array_equal(rows, g.edges[tuple(etype.split(":"))].data[name].numpy()[eids[etype]])

"""`dglkit prepare --dataset chunked`: dataset.json describing a graph in DGL's chunked format, where it is, or
(--whole) the graph read whole into graph.dgl for the single-host builders."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from test_chunked import HETERO_EDGES, HETERO_NODES, edit, write_hetero


@pytest.fixture
def hetero(tmp_path: Path) -> Path:
    return write_hetero(tmp_path / "hetero")


def prepare(cli, path: Path, out: Path) -> tuple[int, dict | None, str]:
    return cli("prepare", "--dataset", "chunked", "--path", path, "--out", out)


def test_describes_a_generated_graph_and_reruns_as_noop_until_a_chunk_changes(cli, tmp_path):
    graph = tmp_path / "graph"
    code, _, err = cli("chunked", "generate", "--out", graph, "--num-chunks", "2", "--num-nodes", "3000",
                       "--avg-degree", "20", "--num-classes", "4", "--feat-dim", "16", "--train-frac", "0.5")
    assert code == 0, err
    code, first, err = prepare(cli, graph, tmp_path / "ds")
    assert code == 0 and first and first["changed"], err
    meta = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert meta["format"] == "chunked" and meta["path"] == str(graph.resolve()) and not meta["heterogeneous"]
    assert meta["num_nodes"] == 3000 and meta["num_classes"] == 4 and meta["feat_dim"] == 16
    assert meta["num_edges"] == meta["edge_types"]["_N:_E:_N"] > 3000 * 10
    assert abs(meta["num_train"] - 1500) < 100 and meta["num_val"] + meta["num_test"] < 1500
    assert not (tmp_path / "ds" / "graph.dgl").exists()
    code, second, _ = prepare(cli, graph, tmp_path / "ds")
    assert code == 0 and second and not second["changed"] and second["fingerprint"] == first["fingerprint"]
    chunk = graph / "node_data" / "_N" / "labels-1.npy"
    os.utime(chunk, ns=(chunk.stat().st_atime_ns, chunk.stat().st_mtime_ns + 10**9))
    code, third, _ = prepare(cli, graph, tmp_path / "ds")
    assert code == 0 and third and third["changed"] and third["fingerprint"] != first["fingerprint"]


def test_describes_a_heterogeneous_graph_without_reading_features(cli, tmp_path, hetero):
    code, result, err = prepare(cli, hetero, tmp_path / "ds")
    assert code == 0 and result, err
    meta = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert meta["heterogeneous"] and meta["category"] == "paper" and meta["feat_dim"] == 3
    assert meta["node_types"]["paper"] == {"num_nodes": 9, "feat_dim": 3}
    assert meta["node_types"]["author"] == {"num_nodes": 6, "feat_dim": 0}
    assert meta["edge_types"] == {etype: len(src) for etype, (src, _) in HETERO_EDGES.items()}
    assert meta["num_nodes"] == sum(map(sum, HETERO_NODES.values()))
    labels = np.concatenate([np.load(hetero / "node_data" / "paper" / f"labels-{i}.npy") for i in range(2)])
    assert meta["num_classes"] == labels.max() + 1
    train = np.concatenate([np.load(hetero / "node_data" / "paper" / f"train_mask-{i}.npy") for i in range(2)])
    assert meta["num_train"] == train.sum()


def test_refuses_missing_chunk_and_labels_on_two_types(cli, tmp_path, hetero):
    (hetero / "edge_index" / "paper:cites:paper1.txt").unlink()
    code, _, err = prepare(cli, hetero, tmp_path / "ds")
    assert code == 2 and "paper:cites:paper1.txt is missing (metadata.json lists it)" in err
    assert not (tmp_path / "ds").exists()
    (hetero / "edge_index" / "paper:cites:paper1.txt").write_text("8 7\n3 1\n")
    edit(hetero, lambda m: m["node_data"].__setitem__("author", {"labels": m["node_data"]["paper"]["labels"]}))
    code, _, err = prepare(cli, hetero, tmp_path / "ds")
    assert code == 2 and "gives labels on ['paper', 'author']" in err


def test_refuses_what_would_need_the_whole_graph(cli, tmp_path, hetero):
    for option in (["--arrays"], ["--val-edges-frac", "0.1"], ["--whole", "--val-edges-frac", "0.1"]):
        code, _, err = cli("prepare", "--dataset", "chunked", "--path", hetero, "--out", tmp_path / "ds", *option)
        assert code == 2 and "not built whole" in err and not (tmp_path / "ds").exists()


def test_refuses_some_masks_without_the_others(cli, tmp_path, hetero):
    edit(hetero, lambda m: m["node_data"]["paper"].pop("val_mask"))
    code, _, err = prepare(cli, hetero, tmp_path / "ds")
    assert code == 2 and "give all three masks or none" in err


def test_the_single_host_partitioners_refuse_a_chunked_dataset(cli, tmp_path, hetero):
    code, _, err = prepare(cli, hetero, tmp_path / "ds")
    assert code == 0, err
    code, _, err = cli("partition", "--dataset-dir", tmp_path / "ds", "--out", tmp_path / "parts", "--num-parts", "2",
                       "--graph-name", "g")
    assert code == 2 and "describes a graph in DGL's chunked format" in err and str(hetero) in err
    assert not (tmp_path / "parts").exists()


def generate(cli, graph: Path) -> None:
    code, _, err = cli("chunked", "generate", "--out", graph, "--num-chunks", "3", "--num-nodes", "2000",
                       "--avg-degree", "8", "--num-classes", "4", "--feat-dim", "8")
    assert code == 0, err


def concatenated(directory: Path, name: str) -> np.ndarray:
    return np.concatenate([np.load(directory / f"{name}-{i}.npy") for i in range(3)])


def test_whole_reads_the_chunks_as_given_and_the_lean_builder_partitions_them(cli, tmp_path):
    import dgl

    graph, out = tmp_path / "graph", tmp_path / "whole"
    generate(cli, graph)
    code, described, err = prepare(cli, graph, tmp_path / "described")
    assert code == 0, err
    code, first, err = cli("prepare", "--dataset", "chunked", "--path", graph, "--out", out, "--whole")
    assert code == 0 and first and first["changed"], err
    assert first["fingerprint"] != described["fingerprint"]
    meta = json.loads((out / "dataset.json").read_text())
    assert "format" not in meta and meta["graph_bytes"] == (out / "graph.dgl").stat().st_size
    g = dgl.load_graphs(str(out / "graph.dgl"))[0][0]
    edges = np.concatenate([np.loadtxt(graph / "edges" / f"_N:_E:_N-{i}.csv", dtype=np.int64) for i in range(3)])
    src, dst = (t.numpy() for t in g.edges())
    # The edges in chunk order, none added (the chunked generator's graph is symmetric already).
    assert np.array_equal(src, edges[:, 0]) and np.array_equal(dst, edges[:, 1])
    node_data = graph / "node_data" / "_N"
    for name in ("feat", "labels", "train_mask"):
        assert np.array_equal(g.ndata[name].numpy(), concatenated(node_data, name)), name
    assert meta["num_edges"] == g.num_edges() and meta["num_train"] == int(g.ndata["train_mask"].sum())
    code, again, _ = cli("prepare", "--dataset", "chunked", "--path", graph, "--out", out, "--whole")
    assert code == 0 and again and not again["changed"]
    code, parts, err = cli("partition", "--dataset-dir", out, "--out", tmp_path / "parts", "--num-parts", "2",
                           "--graph-name", "g")
    assert code == 0 and parts and parts["num_parts"] == 2, err


def test_whole_reads_a_heterogeneous_graph_with_its_edge_data_and_the_partition_carries_it(cli, tmp_path, hetero):
    """Each type's nodes, edges and node data; the citations' edge data on their edges, in chunk order; the partition
    (partition_graph, which every builder matches) holds it under `paper:cites:paper/weight`, by per-type ID
    mapping the chunks' rows."""
    import dgl
    from dgl.data.utils import load_tensors

    code, _, err = cli("prepare", "--dataset", "chunked", "--path", hetero, "--out", tmp_path / "ds", "--whole")
    assert code == 0, err
    g = dgl.load_graphs(str(tmp_path / "ds" / "graph.dgl"))[0][0]
    assert all(g.num_nodes(t) == sum(HETERO_NODES[t]) for t in HETERO_NODES)
    assert {":".join(c): g.num_edges(c) for c in g.canonical_etypes} == {
        etype: len(src) for etype, (src, _) in HETERO_EDGES.items()}
    assert "feat" in g.nodes["paper"].data and "feat" not in g.nodes["author"].data
    weight = g.edges[("paper", "cites", "paper")].data["weight"]  # written as the edges' places: 0, 1, 2, 3
    assert weight.dtype == torch.float32 and weight.tolist() == [0, 1, 2, 3]
    assert [":".join(c) for c in g.canonical_etypes if g.edges[c].data] == ["paper:cites:paper"]
    meta = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert meta["heterogeneous"] and meta["category"] == "paper"
    code, parts, err = cli("partition", "--dataset-dir", tmp_path / "ds", "--out", tmp_path / "parts",
                           "--num-parts", "2", "--graph-name", "g")
    assert code == 0 and parts, err
    with np.load(tmp_path / "parts" / "orig_eids.npz") as eids:
        cites = eids["paper:cites:paper"]
    stored = [load_tensors(str(tmp_path / "parts" / f"part{p}" / "edge_feat.dgl")) for p in range(2)]
    assert np.concatenate([part["paper:cites:paper/weight"].numpy() for part in stored]).tolist() == cites.tolist()


def test_whole_refuses_a_graph_larger_than_the_memory_before_reading_it(cli, tmp_path):
    graph = tmp_path / "graph"
    generate(cli, graph)
    code, _, err = cli("prepare", "--dataset", "chunked", "--path", graph, "--out", tmp_path / "ds", "--whole",
                       "--memory-gb", "0.05")
    assert code == 2 and "reading the chunked graph whole (2000 nodes" in err and "needs about" in err, err
    assert "dgl_job_partition_builder: mpi" in err and not (tmp_path / "ds").exists()


def test_whole_is_for_chunked_graphs_only(cli, tmp_path):
    code, _, err = cli("prepare", "--dataset", "synthetic", "--num-nodes", "100", "--out", tmp_path / "ds", "--whole")
    assert code == 2 and "--whole reads a graph in DGL's chunked format" in err

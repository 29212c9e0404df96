"""`dglkit prepare --dataset chunked`: dataset.json describing a graph in DGL's chunked format, where it is."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

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
    for option in (["--arrays"], ["--val-edges-frac", "0.1"]):
        code, _, err = cli("prepare", "--dataset", "chunked", "--path", hetero, "--out", tmp_path / "ds", *option)
        assert code == 2 and "never built whole" in err and not (tmp_path / "ds").exists()


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

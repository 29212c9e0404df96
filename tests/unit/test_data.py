"""`dglkit prepare`: synthetic, OGB raw layout offline, and user files, with real DGL and ogb."""

import gzip
import json
from pathlib import Path

import dgl
import numpy as np
import pytest


def load(out: Path) -> tuple[dgl.DGLGraph, dict]:
    (graph,), _ = dgl.load_graphs(str(out / "graph.dgl"))
    return graph, json.loads((out / "dataset.json").read_text())


def test_synthetic_graph_is_valid_and_learnable(synthetic_dataset):
    graph, meta = load(synthetic_dataset)
    n = graph.num_nodes()
    assert n == meta["num_nodes"] == 4000 and graph.num_edges() == meta["num_edges"]
    assert graph.ndata["feat"].dtype == dgl.backend.float32 and graph.ndata["feat"].shape == (n, 32)
    labels = graph.ndata["labels"].numpy()
    assert labels.dtype == np.int64 and labels.ndim == 1 and set(np.unique(labels)) == set(range(5))
    # DGL's file format has no bool: masks written as bool come back as 0/1 uint8.
    masks = [graph.ndata[name].numpy() for name in ("train_mask", "val_mask", "test_mask")]
    assert all(mask.dtype == np.uint8 and mask.max() == 1 for mask in masks)
    masks = [mask.astype(bool) for mask in masks]
    assert [mask.sum() for mask in masks] == [2000, 800, 1200] == [meta["num_train"], meta["num_val"], meta["num_test"]]
    assert (sum(mask.astype(int) for mask in masks) <= 1).all()
    src, dst = (ids.numpy() for ids in graph.edges())
    pairs = set(zip(src.tolist(), dst.tolist()))
    assert not (src == dst).any() and len(pairs) == len(src), "self loops or duplicate edges"
    assert pairs == {(v, u) for u, v in pairs}, "not symmetric"
    # Features carry the class weakly; the mean of a node's neighbours carries it much better (homophily).
    feat = graph.ndata["feat"].numpy()
    neighbour_mean = np.zeros_like(feat)
    np.add.at(neighbour_mean, dst, feat[src])
    neighbour_mean /= np.maximum(np.bincount(dst, minlength=n), 1)[:, None]
    train, test = masks[0], masks[2]
    chance = np.bincount(labels[test]).max() / test.sum()
    own, graph_acc = (centroid_accuracy(x, labels, train, test) for x in (feat, feat + neighbour_mean))
    assert chance < 0.3 and own > chance + 0.1 and graph_acc > own + 0.1 and graph_acc < 0.99


def centroid_accuracy(x: np.ndarray, labels: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    centres = np.stack([x[train & (labels == c)].mean(0) for c in range(labels.max() + 1)])
    predicted = ((x[test, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
    return float((predicted == labels[test]).mean())


def test_synthetic_rerun_is_noop_and_other_inputs_rebuild(cli, tmp_path):
    args = ["prepare", "--dataset", "synthetic", "--out", tmp_path, "--num-nodes", "500", "--feat-dim", "8"]
    code, first, _ = cli(*args, "--seed", "1")
    assert code == 0 and first["changed"]
    stamp = (tmp_path / "graph.dgl").stat().st_mtime_ns
    code, second, _ = cli(*args, "--seed", "1")
    assert code == 0 and not second["changed"] and second["fingerprint"] == first["fingerprint"]
    assert (tmp_path / "graph.dgl").stat().st_mtime_ns == stamp
    code, third, _ = cli(*args, "--seed", "2")
    assert code == 0 and third["changed"] and third["fingerprint"] != first["fingerprint"]


def test_synthetic_is_reproducible(cli, tmp_path):
    graphs = []
    for name in ("a", "b"):
        code, _, _ = cli("prepare", "--dataset", "synthetic", "--out", tmp_path / name, "--num-nodes", "300",
                         "--feat-dim", "4", "--seed", "3")
        assert code == 0
        graphs.append(load(tmp_path / name)[0])
    a, b = graphs
    assert all((x == y).all() for x, y in zip(a.edges(), b.edges()))
    assert all((a.ndata[key] == b.ndata[key]).all() for key in a.ndata)


@pytest.mark.parametrize("args, message", [
    (["--num-classes", "1"], "--num-classes must be >= 2"),
    (["--train-frac", "0.8", "--val-frac", "0.3"], "split fractions"),
    (["--avg-degree", "0"], "--avg-degree must be > 0"),
    (["--homophily", "1.5"], "--homophily and --label-noise"),
    (["--num-communities", "3", "--num-classes", "4"], "--num-communities must be 0 (automatic) or between"),
])
def test_synthetic_bad_arguments(cli, tmp_path, args, message):
    code, _, err = cli("prepare", "--dataset", "synthetic", "--out", tmp_path / "out", *args)
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_unknown_dataset_and_out_is_a_file(cli, tmp_path):
    code, _, err = cli("prepare", "--dataset", "cora", "--out", tmp_path)
    assert code == 2 and "use synthetic, synthetic-hetero, files or an ogbn-* name" in err
    (tmp_path / "file").write_text("x")
    code, _, err = cli("prepare", "--dataset", "synthetic", "--out", tmp_path / "file", "--num-nodes", "100")
    assert code == 2 and "is a file" in err


# A tiny graph in ogb's raw layout (what the official ogbn-products zip holds, much smaller).
OGB_NODES, OGB_EDGES = 12, np.array([[0, 1], [1, 2], [2, 3], [3, 4], [5, 6], [6, 7], [8, 9], [10, 11], [4, 11]])
OGB_SPLIT = {"train": [0, 1, 2, 3, 5, 6], "valid": [7, 8], "test": [9, 10, 11]}


def write_csv_gz(path: Path, rows: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, np.asarray(rows).reshape(len(rows), -1), delimiter=",", fmt="%g")


def write_ogb_products(root: Path, dirname: str, release: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    feat, labels = rng.random((OGB_NODES, 3)).round(3), rng.integers(0, 4, OGB_NODES)
    base = root / dirname
    write_csv_gz(base / "raw" / "edge.csv.gz", OGB_EDGES)
    write_csv_gz(base / "raw" / "num-node-list.csv.gz", [OGB_NODES])
    write_csv_gz(base / "raw" / "num-edge-list.csv.gz", [len(OGB_EDGES)])
    write_csv_gz(base / "raw" / "node-feat.csv.gz", feat)
    write_csv_gz(base / "raw" / "node-label.csv.gz", labels)
    for name, ids in OGB_SPLIT.items():
        write_csv_gz(base / "split" / "sales_ranking" / f"{name}.csv.gz", ids)
    if release:
        (base / "RELEASE_v1.txt").write_text("")
    return feat, labels


@pytest.mark.parametrize("dirname", ["ogbn_products", "products"])
def test_ogb_offline_raw_layout(cli, tmp_path, dirname):
    feat, labels = write_ogb_products(tmp_path / "root", dirname)
    out = tmp_path / "out"
    args = ["prepare", "--dataset", "ogbn-products", "--data-root", tmp_path / "root", "--out", out]
    assert cli(*args)[1]["changed"]
    graph, meta = load(out)
    assert meta["source"] == "ogbn-products" and meta["num_nodes"] == OGB_NODES
    np.testing.assert_allclose(graph.ndata["feat"].numpy(), feat, rtol=1e-6)
    assert (graph.ndata["labels"].numpy() == labels).all()
    for mask, key in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert np.flatnonzero(graph.ndata[mask].numpy()).tolist() == OGB_SPLIT[key]
    # ogb adds the inverse of every edge for ogbn-products.
    assert set(zip(*(ids.tolist() for ids in graph.edges()))) == {*map(tuple, OGB_EDGES), *map(tuple, OGB_EDGES[:, ::-1])}
    assert not cli(*args)[1]["changed"]


def test_ogb_missing_files_fail_without_download_or_prompt(dglkit, tmp_path):
    proc = dglkit("prepare", "--dataset", "ogbn-products", "--data-root", tmp_path, "--out", tmp_path / "out",
                  check=False, timeout=60)
    assert proc.returncode == 2
    assert f"expected {tmp_path}/ogbn_products/RELEASE_v1.txt" in proc.stderr and "--allow-download" in proc.stderr
    write_ogb_products(tmp_path, "ogbn_products", release=False)
    proc = dglkit("prepare", "--dataset", "ogbn-products", "--data-root", tmp_path, "--out", tmp_path / "out",
                  check=False, timeout=60)
    assert proc.returncode == 2 and "RELEASE_v1.txt is missing" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_ogb_rejects_unsupported_datasets(cli, tmp_path):
    code, _, err = cli("prepare", "--dataset", "ogbn-proteins", "--data-root", tmp_path, "--out", tmp_path / "o")
    assert code == 2 and "not a multiclass dataset" in err
    code, _, err = cli("prepare", "--dataset", "ogbn-nope", "--data-root", tmp_path, "--out", tmp_path / "o")
    assert code == 2 and "unknown OGB dataset" in err


def user_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"edges": np.array([[0, 1], [1, 2], [2, 0], [3, 4], [4, 5]]), "feat": rng.random((6, 4)),
            "labels": np.array([0, 1, 0, 1, 2, 2]),
            "train_mask": np.array([1, 1, 1, 0, 0, 0], bool), "val_mask": np.array([0, 0, 0, 1, 1, 0], bool),
            "test_mask": np.array([0, 0, 0, 0, 0, 1], bool)}


def test_files_npz_with_masks(cli, tmp_path):
    arrays = user_arrays()
    np.savez(tmp_path / "g.npz", **arrays)
    code, result, _ = cli("prepare", "--dataset", "files", "--path", tmp_path / "g.npz", "--out", tmp_path / "o",
                          "--add-reverse-edges")
    assert code == 0 and result["num_nodes"] == 6 and result["num_edges"] == 10
    graph, _ = load(tmp_path / "o")
    np.testing.assert_array_equal(graph.ndata["feat"].numpy(), arrays["feat"].astype(np.float32))
    for name in ("labels", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(graph.ndata[name].numpy(), arrays[name])
    assert not cli("prepare", "--dataset", "files", "--path", tmp_path / "g.npz", "--out", tmp_path / "o",
                   "--add-reverse-edges")[1]["changed"]


def test_files_directory_csv_and_fractions(cli, tmp_path):
    arrays = user_arrays()
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "feat.npy", arrays["feat"].astype(np.float32))
    (data / "edges.csv").write_text("src,dst\n" + "".join(f"{u},{v}\n" for u, v in arrays["edges"]))
    (data / "labels.csv").write_text("".join(f"{y}\n" for y in arrays["labels"]))
    code, result, _ = cli("prepare", "--dataset", "files", "--path", data, "--out", tmp_path / "o",
                          "--train-frac", "0.5", "--val-frac", "0.3", "--test-frac", "0.2")
    assert code == 0 and result["num_edges"] == 5
    graph, meta = load(tmp_path / "o")
    assert [meta["num_train"], meta["num_val"], meta["num_test"]] == [3, 2, 1]
    assert graph.edges()[0].tolist() == arrays["edges"][:, 0].tolist()
    # 2 x E edges are accepted too; changing an input file rebuilds.
    np.save(data / "edges.npy", arrays["edges"].T)
    code, result, _ = cli("prepare", "--dataset", "files", "--path", data, "--out", tmp_path / "o")
    assert code == 0 and result["changed"] and result["num_edges"] == 5


@pytest.mark.parametrize("change, message", [
    ({"edges": np.array([[0, 1], [1, 6]])}, "edge node ids must be in [0, 6)"),
    ({"edges": np.array([[0, 1, 2]])}, "edges must be an integer E x 2 or 2 x E array"),
    ({"edges": np.array([[0.0, 1.0], [1.0, 2.0]])}, "edges must be an integer"),
    ({"labels": np.array([0, 1, 0, 1, 2.5, 2])}, "labels must be 6 integers"),
    ({"labels": np.array([0, 1, 0, 1])}, "labels must be 6 integers"),
    ({"labels": np.array([0, -1, 0, 1, 1, 1])}, "labels must be class ids >= 0"),
    ({"labels": np.zeros(6, int)}, "fewer than 2 distinct classes"),
    ({"feat": np.array([1.0, 2, 3, 4, 5, 6])}, "feat must be a numeric N x F array"),
    ({"feat": np.full((6, 2), np.nan)}, "NaN or infinite"),
    ({"train_mask": np.ones(5, bool)}, "train_mask must be 6 booleans"),
    ({"val_mask": np.array([1, 0, 0, 1, 1, 0], bool)}, "overlap"),
    ({"test_mask": None}, "give all three or none"),
    ({"feat": None}, "missing feat"),
])
def test_files_bad_inputs(cli, tmp_path, change, message):
    arrays = {key: value for key, value in {**user_arrays(), **change}.items() if value is not None}
    np.savez(tmp_path / "g.npz", **arrays)
    code, _, err = cli("prepare", "--dataset", "files", "--path", tmp_path / "g.npz", "--out", tmp_path / "o")
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_files_missing_path(cli, tmp_path):
    code, _, err = cli("prepare", "--dataset", "files", "--path", tmp_path / "nope", "--out", tmp_path / "o")
    assert code == 2 and "--dataset files needs --path" in err


def test_arrays_hold_the_graph_as_graph_dgl_loads_it(cli, synthetic_dataset, tmp_path):
    graph, meta = load(synthetic_dataset)
    arrays = synthetic_dataset / meta["arrays"]["dir"]
    for name, ids in zip(("src", "dst"), graph.edges()):
        np.testing.assert_array_equal(np.load(arrays / f"{name}.npy"), ids.numpy())
    assert set(meta["arrays"]["node_data"]) == set(graph.ndata)
    for name in meta["arrays"]["node_data"]:
        array, want = np.load(arrays / f"node_{name}.npy"), graph.ndata[name].numpy()
        assert array.dtype == want.dtype and (array == want).all(), name
    # Asked for later, the arrays come with a rebuild; not asked for, they stay.
    args = ["prepare", "--dataset", "synthetic", "--out", tmp_path, "--num-nodes", "500", "--feat-dim", "8"]
    assert cli(*args)[1]["changed"] and not (tmp_path / "arrays").exists()
    assert cli(*args, "--arrays")[1]["changed"] and (tmp_path / "arrays" / "node_feat.npy").is_file()
    assert not cli(*args)[1]["changed"] and (tmp_path / "arrays").is_dir()
    assert cli(*args, "--seed", "3")[1]["changed"] and not (tmp_path / "arrays").exists(), "stale arrays kept"

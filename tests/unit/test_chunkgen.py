"""`dglkit chunked generate`: synthetic graphs written chunk by chunk in DGL's chunked format, each chunk from
(seed, chunk) alone, read back with dglkit.chunked."""

import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dglkit import chunked
from test_data import centroid_accuracy

APP = Path(__file__).resolve().parents[2] / "app"

SMALL = ["--num-nodes", "4000", "--avg-degree", "12", "--num-classes", "5", "--feat-dim", "32", "--seed", "7",
         "--train-frac", "0.5", "--val-frac", "0.2", "--test-frac", "0.3"]


def generate(cli, out: Path, *args: object) -> dict:
    code, result, err = cli("chunked", "generate", "--out", out, *SMALL, *args)
    assert code == 0, err
    assert result is not None
    return result


def whole(graph: chunked.ChunkedGraph, etype: str) -> tuple[np.ndarray, np.ndarray]:
    parts = [chunked.read_edges(graph, etype, i) for i in range(len(graph.edge_chunks[etype]))]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def node_data(graph: chunked.ChunkedGraph, ntype: str, name: str) -> np.ndarray:
    return np.concatenate([chunked.read_node_data(graph, ntype, name, i) for i in range(len(graph.node_chunks[ntype]))])


def test_homogeneous_graph_passes_the_checks_and_is_learnable(cli, tmp_path):
    generate(cli, tmp_path, "--num-chunks", "3")
    graph = chunked.load(tmp_path)
    assert graph.node_types == ["_N"] and graph.edge_types == ["_N:_E:_N"] and not graph.heterogeneous
    assert graph.node_chunks["_N"] == [1334, 1333, 1333]
    chunked.check_chunks(graph, range(3))
    src, dst = whole(graph, "_N:_E:_N")
    n = graph.num_nodes["_N"]
    assert 10 < len(src) / n < 13 and not (src == dst).any()
    pairs = set(zip(src.tolist(), dst.tolist()))
    assert pairs == {(v, u) for u, v in pairs}, "not symmetric"
    assert len(pairs) > 0.99 * len(src), "more than 1% duplicate edges"
    assert np.bincount(dst, minlength=n).max() > 8 * 12, "no hubs: degrees are not power-law-like"
    feat, labels = node_data(graph, "_N", "feat"), node_data(graph, "_N", "labels")
    masks = [node_data(graph, "_N", name).astype(bool) for name in ("train_mask", "val_mask", "test_mask")]
    assert (sum(m.astype(int) for m in masks) <= 1).all() and abs(masks[0].mean() - 0.5) < 0.03
    # As today's synthetic graph: features carry the class weakly, their neighbours' mean much better.
    neighbour_mean = np.zeros_like(feat)
    np.add.at(neighbour_mean, dst, feat[src])
    neighbour_mean /= np.maximum(np.bincount(dst, minlength=n), 1)[:, None]
    chance = np.bincount(labels[masks[2]]).max() / masks[2].sum()
    own, graph_acc = (centroid_accuracy(x, labels, masks[0], masks[2]) for x in (feat, feat + neighbour_mean))
    assert chance < 0.3 and own > chance + 0.1 and graph_acc > own + 0.1 and graph_acc < 0.99
    # Communities are spread over the ID range: an ID-range split into 3 cuts most edges.
    assert (src * 3 // n != dst * 3 // n).mean() > 0.5


def test_two_writers_halves_equal_one_writers_whole(cli, tmp_path):
    generate(cli, tmp_path / "one", "--num-chunks", "4")
    shared = tmp_path / "two"
    first = generate(cli, shared, "--num-chunks", "4", "--chunks", "2,0")
    assert first["written_chunks"] == [2, 0] and not (shared / "metadata.json").exists()
    code, _, err = cli("chunked", "finish", "--out", shared)
    assert code == 2 and "chunks [1, 3] are not written" in err and "--chunks 1,3" in err
    generate(cli, shared, "--num-chunks", "4", "--chunks", "1,3")
    code, result, err = cli("chunked", "finish", "--out", shared)
    assert code == 0 and result and result["changed"], err
    one = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.*") if "manifests" not in p.parts)
    two = sorted(p.relative_to(shared) for p in shared.rglob("*.*") if "manifests" not in p.parts)
    assert one == two and len(one) == 4 * 6 + 1
    assert all(filecmp.cmp(tmp_path / "one" / p, shared / p, shallow=False) for p in one)


def test_a_killed_writer_leaves_a_chunk_that_no_later_run_trusts(cli, tmp_path):
    """A writer killed once its chunk's edges are written, its node data still to come: the chunk has no
    manifest, finish refuses naming it, and the next run writes it again."""
    big = ["--num-chunks", "2", "--num-nodes", "400000", "--feat-dim", "256", "--seed", "1"]
    writer = subprocess.Popen([sys.executable, "-m", "dglkit", "chunked", "generate", "--out", str(tmp_path), *big,
                               "--chunks", "0"], env={**os.environ, "PYTHONPATH": str(APP)},
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "edges" / "_N:_E:_N-0.csv").exists() and writer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.kill()
    writer.wait()
    assert (tmp_path / "edges" / "_N:_E:_N-0.csv").exists() and not (tmp_path / "manifests" / "chunk-0.json").exists()
    assert cli("chunked", "generate", "--out", tmp_path, *big, "--chunks", "1")[1]["written_chunks"] == [1]
    code, _, err = cli("chunked", "finish", "--out", tmp_path)
    assert code == 2 and "chunks [0] are not written" in err and not (tmp_path / "metadata.json").exists()
    assert cli("chunked", "generate", "--out", tmp_path, *big, "--chunks", "0")[1]["written_chunks"] == [0]
    assert cli("chunked", "finish", "--out", tmp_path)[1]["changed"]


def test_rerun_writes_nothing_and_other_parameters_rewrite(cli, tmp_path):
    generate(cli, tmp_path, "--num-chunks", "2")
    stamp = (tmp_path / "metadata.json").stat().st_mtime_ns
    again = generate(cli, tmp_path, "--num-chunks", "2")
    assert not again["changed"] and (tmp_path / "metadata.json").stat().st_mtime_ns == stamp
    other = generate(cli, tmp_path, "--num-chunks", "2", "--homophily", "0.5", "--chunks", "1")
    assert other["written_chunks"] == [1] and not (tmp_path / "metadata.json").exists()
    code, _, err = cli("chunked", "finish", "--out", tmp_path)
    assert code == 2 and "chunks [0] are not written with the parameters of" in err


@pytest.mark.parametrize("dataset, arrays", [("synthetic", 6), ("synthetic-hetero", 13)])
def test_a_writer_counts_the_arrays_of_its_chunk_as_its_progress(cli, tmp_path, monkeypatch, dataset, arrays):
    """What `dglkit follow` shows of a chunk being written: its arrays, made and written, of all it has (one per
    edge type, the labelled type's five node data)."""
    monkeypatch.setenv("DGLKIT_PROGRESS", str(tmp_path / "progress.json"))
    generate(cli, tmp_path / "graph", "--dataset", dataset, "--num-chunks", "3", "--chunks", "2")
    record = json.loads((tmp_path / "progress.json").read_text())
    assert record["phase"] == "chunk 2 of 3: make and write its arrays"
    assert (record["done"], record["total"], record["unit"]) == (arrays, arrays, "arrays")


def test_heterogeneous_graph_is_shaped_like_ogbn_mag(cli, tmp_path):
    generate(cli, tmp_path, "--num-chunks", "2", "--dataset", "synthetic-hetero")
    graph = chunked.load(tmp_path)
    assert graph.heterogeneous and graph.node_types == ["paper", "author", "institution", "field_of_study"]
    assert graph.num_nodes == {"paper": 4000, "author": 2000, "institution": 20, "field_of_study": 40}
    assert set(graph.node_data) == {"paper"}, "authors, institutions and fields are featureless"
    relations = {e for e in graph.edge_types if ":rev_" not in e}
    assert relations == {"author:affiliated_with:institution", "author:writes:paper",
                         "paper:has_topic:field_of_study", "paper:cites:paper"}
    chunked.check_chunks(graph, [0, 1])
    for etype in relations:
        src, dst = whole(graph, etype)
        s, rel, d = etype.split(":")
        assert len(src) > 0 and np.array_equal(whole(graph, f"{d}:rev_{rel}:{s}"), (dst, src))
    src, dst = whole(graph, "paper:cites:paper")
    labels = node_data(graph, "paper", "labels")
    assert not (src == dst).any() and (labels[src] == labels[dst]).mean() > 0.6, "citations follow the class"


@pytest.mark.parametrize("args, expected", [
    (["--num-chunks", "0"], "--num-chunks must be between 1"),
    (["--num-chunks", "2", "--chunks", "2"], "chunk indices run from 0 to --num-chunks - 1 = 1"),
    (["--num-chunks", "2", "--homophily", "2"], "--homophily and --label-noise are fractions"),
])
def test_refuses_bad_arguments_before_writing(cli, tmp_path, args, expected):
    code, _, err = cli("chunked", "generate", "--out", tmp_path / "g", *SMALL, *args)
    assert code == 2 and expected in err and not (tmp_path / "g").exists()


def test_a_chunk_larger_than_the_memory_is_refused_before_writing_and_a_written_one_is_not_judged(cli, tmp_path):
    args = ["--num-chunks", "2", "--num-nodes", "200000", "--feat-dim", "1024"]
    code, _, err = cli("chunked", "generate", "--out", tmp_path / "g", *args, "--chunks", "1", "--memory-gb", "0.5")
    # 100k nodes: 0.1 GB and 100k x (4 x 1024 + 24 x 10 + 16) bytes.
    assert code == 2 and "writing a chunk of 100000 nodes needs about 0.5 GB of memory" in err, err
    assert "more chunks, each smaller" in err and not (tmp_path / "g").exists()
    small = ["--num-chunks", "2", "--num-nodes", "2000", "--feat-dim", "8"]
    assert cli("chunked", "generate", "--out", tmp_path / "s", *small, "--chunks", "0")[0] == 0
    # Written already: a re-run writes nothing and checks no memory.
    code, again, err = cli("chunked", "generate", "--out", tmp_path / "s", *small, "--chunks", "0", "--memory-gb", "0.01")
    assert code == 0 and again["written_chunks"] == [] and not again["changed"], err

"""dglkit.chunked: DGL's chunked graph format read chunk by chunk, and each kind of bad input refused by name.

The fixtures write metadata.json and the files by hand the way DGL's tools/chunk_graph.py writes them (edge
ids as space-separated csv, node data as .npy, paths relative or absolute)."""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dglkit import chunked
from dglkit.common import UserError

HETERO_NODES = {"paper": [5, 4], "author": [3, 3], "institution": [2, 1], "field": [2, 2]}
HETERO_EDGES = {
    "author:writes:paper": ([0, 1, 2, 5, 4], [0, 1, 2, 8, 7]),
    "author:affiliated_with:institution": ([0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 2]),
    "paper:cites:paper": ([1, 2, 3, 8], [0, 0, 1, 7]),
    "paper:has_topic:field": ([0, 4, 6], [3, 1, 0]),
}


def split(values: list[int], counts: list[int]) -> list[list[int]]:
    ends = np.cumsum(counts)
    return [values[end - count:end] for count, end in zip(counts, ends)]


def write_graph(root: Path, nodes: dict[str, list[int]], edges: dict[str, tuple[list[int], list[int]]],
                node_data: dict[str, dict[str, np.ndarray]], edge_data: dict[str, dict[str, np.ndarray]]) -> Path:
    """A chunked graph as DGL's chunk_graph.py writes it; edges of each type in two chunks of about half."""
    root.mkdir(parents=True)
    edge_chunks = {etype: [len(src) - len(src) // 2, len(src) // 2] for etype, (src, _) in edges.items()}
    meta: dict = {"graph_name": "g", "node_type": list(nodes), "num_nodes_per_chunk": list(nodes.values()),
                  "edge_type": list(edges), "num_edges_per_chunk": list(edge_chunks.values()),
                  "edges": {}, "node_data": {}, "edge_data": {}}
    (root / "edge_index").mkdir()
    for etype, (src, dst) in edges.items():
        paths = []
        for i, (s, d) in enumerate(zip(split(src, edge_chunks[etype]), split(dst, edge_chunks[etype]))):
            paths.append(f"edge_index/{etype}{i}.txt")
            np.savetxt(root / paths[-1], np.stack([s, d], 1), fmt="%d", delimiter=" ")
        meta["edges"][etype] = {"format": {"name": "csv", "delimiter": " "}, "data": paths}
    for key, data, chunks in (("node_data", node_data, nodes), ("edge_data", edge_data, edge_chunks)):
        for kind, arrays in data.items():
            (root / key / kind).mkdir(parents=True)
            meta[key][kind] = {}
            for name, array in arrays.items():
                paths = []
                for i, count in enumerate(chunks[kind]):
                    # chunk_graph.py writes absolute paths; DGL reads relative ones against the directory too.
                    paths.append(str(root / key / kind / f"{name}-{i}.npy") if i else f"{key}/{kind}/{name}-{i}.npy")
                    start = sum(chunks[kind][:i])
                    np.save(root / key / kind / f"{name}-{i}.npy", array[start:start + count])
                meta[key][kind][name] = {"format": {"name": "numpy"}, "data": paths}
    (root / "metadata.json").write_text(json.dumps(meta))
    return root


def write_hetero(root: Path) -> Path:
    """Four node types (author, institution and field featureless), labels and masks on paper, edge data on
    cites."""
    rng = np.random.default_rng(0)
    papers = sum(HETERO_NODES["paper"])
    paper = {"feat": rng.standard_normal((papers, 3), dtype=np.float32), "labels": rng.integers(0, 3, papers),
             **{name: rng.random(papers) < 0.4 for name in ("train_mask", "val_mask", "test_mask")}}
    return write_graph(root, HETERO_NODES, HETERO_EDGES, {"paper": paper},
                       {"paper:cites:paper": {"weight": np.arange(4, dtype=np.float32)}})


@pytest.fixture
def hetero(tmp_path: Path) -> Path:
    return write_hetero(tmp_path / "hetero")


@pytest.fixture
def homo(tmp_path: Path) -> Path:
    """DGL's homogeneous names (_N, _N:_E:_N), three node chunks."""
    src, dst = [0, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 0]
    data = {"feat": np.ones((7, 4), np.float32), "labels": np.arange(7) % 2}
    return write_graph(tmp_path / "homo", {"_N": [3, 2, 2]}, {"_N:_E:_N": (src + dst, dst + src)}, {"_N": data}, {})


def edit(root: Path, change: Callable[[dict], object]) -> None:
    meta = json.loads((root / "metadata.json").read_text())
    change(meta)
    (root / "metadata.json").write_text(json.dumps(meta))


def test_reads_heterogeneous_graph_chunk_by_chunk(hetero):
    graph = chunked.load(hetero)
    assert graph.heterogeneous and graph.node_types == list(HETERO_NODES)
    assert graph.num_nodes == {t: sum(c) for t, c in HETERO_NODES.items()}
    assert [graph.node_offset(t) for t in graph.node_types] == [0, 9, 15, 18]
    assert set(graph.node_data) == {"paper"} and graph.num_chunks == 2
    chunked.check_chunks(graph, range(graph.num_chunks))
    for etype, (src, dst) in HETERO_EDGES.items():
        parts = [chunked.read_edges(graph, etype, i) for i in range(2)]
        assert all(ids.dtype == np.int64 for part in parts for ids in part)
        assert np.concatenate([p[0] for p in parts]).tolist() == src
        assert np.concatenate([p[1] for p in parts]).tolist() == dst
    feat = np.concatenate([chunked.read_node_data(graph, "paper", "feat", i) for i in range(2)])
    assert feat.shape == (9, 3) and feat.dtype == np.float32
    weight = [chunked.read_edge_data(graph, "paper:cites:paper", "weight", i) for i in range(2)]
    assert np.concatenate(weight).tolist() == [0, 1, 2, 3]


def test_reads_homogeneous_graph(homo):
    graph = chunked.load(homo)
    assert not graph.heterogeneous and graph.num_nodes == {"_N": 7} and graph.num_edges == {"_N:_E:_N": 14}
    chunked.check_chunks(graph, [2, 0, 1])
    assert chunked.read_node_data(graph, "_N", "labels", 2).tolist() == [1, 0]


def refusal(root: Path, chunks: list[int] | None = None) -> str:
    with pytest.raises(UserError) as error:
        graph = chunked.load(root)
        chunked.check_chunks(graph, range(graph.num_chunks) if chunks is None else chunks)
    return str(error.value)


def test_refuses_edge_chunk_with_more_rows_than_metadata(hetero):
    edit(hetero, lambda m: m["num_edges_per_chunk"][2].__setitem__(1, 1))
    message = refusal(hetero)
    assert "paper:cites:paper1.txt: 2 edges" in message and "num_edges_per_chunk says 1" in message


def test_refuses_node_data_chunk_of_other_length_than_node_chunk(hetero):
    np.save(hetero / "node_data" / "paper" / "labels-1.npy", np.zeros(3, np.int64))
    message = refusal(hetero)
    assert "labels-1.npy: 3 rows, but paper chunk 1 (node) has 4" in message


def test_refuses_ids_out_of_range(hetero):
    (hetero / "edge_index" / "paper:has_topic:field1.txt").write_text("6 4\n")
    message = refusal(hetero)
    assert "destination id 4 is outside field's [0, 4)" in message


def test_refuses_negative_ids(homo):
    (homo / "edge_index" / "_N:_E:_N0.txt").write_text("\n".join(["0 1"] * 6 + ["-1 2"]) + "\n")
    assert "source id -1 is outside _N's [0, 7)" in refusal(homo)


def test_refuses_missing_chunk_file_only_where_it_is_checked(hetero):
    (hetero / "node_data" / "paper" / "feat-1.npy").unlink()
    assert "feat-1.npy is missing (metadata.json lists it)" in refusal(hetero)
    chunked.check_chunks(chunked.load(hetero), [0])  # another host's chunk: its check passes


def test_refuses_mixed_dtypes_across_chunks(hetero):
    np.save(hetero / "node_data" / "paper" / "feat-1.npy", np.zeros((4, 3), np.float64))
    message = refusal(hetero, [1])
    assert "feat-1.npy: float64 rows of shape (3,), but feat-0.npy (chunk 0) has float32 (3,)" in message


def test_refuses_non_integer_edge_ids(homo):
    (homo / "edge_index" / "_N:_E:_N1.txt").write_text("1 2\n2 3.5\n" + "0 1\n" * 5)
    assert "_N:_E:_N1.txt: holds something other than edge ids" in refusal(homo, [1])


def test_refuses_unknown_types(hetero):
    edit(hetero, lambda m: m["node_data"].__setitem__("venue", m["node_data"]["paper"]))
    assert "node_data names types ['venue'] that node_type does not list" in refusal(hetero)
    edit(hetero, lambda m: (m["node_data"].pop("venue"), m["edges"].__setitem__("a:b:c", {})))
    assert "edges names types ['a:b:c'] that edge_type does not list" in refusal(hetero)
    edit(hetero, lambda m: (m["edges"].pop("a:b:c"), m["edge_type"].__setitem__(0, "author:writes:venue")))
    assert "'author:writes:venue' must be 'src:relation:dst' with src and dst from node_type" in refusal(hetero)


@pytest.mark.parametrize("change, expected", [
    (lambda m: m.pop("graph_name"), "graph_name must be a non-empty string"),
    (lambda m: m["num_nodes_per_chunk"].pop(), "num_nodes_per_chunk must hold one list of counts per type"),
    (lambda m: m["num_nodes_per_chunk"][0].__setitem__(0, -1), "lists must hold counts >= 0"),
    (lambda m: m["edges"]["paper:cites:paper"]["data"].pop(), "lists 1 files but the type has 2 chunks"),
    (lambda m: m["edges"].pop("paper:cites:paper"), "has no files for ['paper:cites:paper']"),
    (lambda m: m["edges"]["paper:cites:paper"]["format"].update(name="parquet"), "needs pyarrow"),
    (lambda m: m["node_data"]["paper"]["feat"].update(format={"name": "hdf5"}), "must be one of csv, numpy"),
])
def test_refuses_malformed_metadata(hetero, change, expected):
    edit(hetero, change)
    message = refusal(hetero)
    assert expected in message and str(hetero / "metadata.json") in message


def test_refuses_metadata_that_is_not_json(homo):
    (homo / "metadata.json").write_text("{")
    assert "is not readable JSON" in refusal(homo)

"""The distributed partitioner (dglkit.mpiassign, dglkit.mpibuild) under a real mpirun on loopback, 2 and 4
ranks on the shared synthetic graph (a degree-corrected block model: a partitioner's cut shows)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dgl
import numpy as np
import psutil
import pytest
from dgl.data.utils import load_tensors

from dglkit import chunked, leanpart
from dglkit.mpiassign import load_assignment
from localjob import build
from test_partition import assert_same_files, owned_and_halo

APP = Path(__file__).resolve().parents[2] / "app"
MPIRUN = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]
ENV = {**os.environ, "PYTHONPATH": str(APP), "DGLBACKEND": "pytorch",
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture(scope="module")
def directed_dataset(synthetic_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic graph's edges one way only (a random half), with self loops and duplicates added: the
    edges into halo nodes are then not all reverses of in-edges, and the partitioner's input must be made
    symmetric and simple."""
    src, dst, _ = arrays(synthetic_dataset)
    rng = np.random.default_rng(3)
    one_way = rng.random(len(src)) < 0.5
    loops = rng.integers(0, len(src) // 12, 200)
    edges = np.stack([np.concatenate([src[one_way], loops, src[:300]]), np.concatenate([dst[one_way], loops, dst[:300]])], 1)
    directory = tmp_path_factory.mktemp("directed")
    np.savez(directory / "graph.npz", edges=edges, feat=np.load(synthetic_dataset / "arrays" / "node_feat.npy"),
             labels=np.load(synthetic_dataset / "arrays" / "node_labels.npy"))
    build("prepare", "--dataset", "files", "--path", directory / "graph.npz", "--out", directory / "dataset", "--arrays")
    return directory / "dataset"


def mpi_command(ranks: int, program: str, *args: object) -> list[str]:
    return [*MPIRUN, "-np", str(ranks), sys.executable, "-m", f"dglkit.{program}", *map(str, args)]


def mpirun(ranks: int, program: str, *args: object, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(mpi_command(ranks, program, *args), capture_output=True, text=True, env=ENV,
                          stdin=subprocess.DEVNULL, timeout=300)
    if check and proc.returncode:
        raise AssertionError(f"{program} on {ranks} ranks exited {proc.returncode}:\n{proc.stdout[-2000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def arrays(dataset: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    directory = dataset / "arrays"
    return (np.load(directory / "src.npy"), np.load(directory / "dst.npy"),
            np.load(directory / "node_train_mask.npy").astype(bool))


def pair_cut(assignment: np.ndarray, src: np.ndarray, dst: np.ndarray) -> int:
    """Node pairs joined by an edge whose ends are in different parts: what both partitioners minimise."""
    low, high = np.divmod(leanpart.undirected_pairs(src, dst, len(assignment)), len(assignment))
    return int(np.count_nonzero(assignment[low] != assignment[high]))


@pytest.mark.parametrize("ranks, num_parts, dataset", [(2, 2, "synthetic_dataset"), (4, 4, "synthetic_dataset"),
                                                       (2, 4, "synthetic_dataset"), (4, 2, "directed_dataset")])
def test_assignment_covers_every_node_balanced_and_cuts_like_metis(request, tmp_path, ranks, num_parts, dataset):
    synthetic_dataset = request.getfixturevalue(dataset)
    out = tmp_path / "assignment"
    result = json.loads(mpirun(ranks, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", out,
                               "--num-parts", num_parts).stdout.strip().splitlines()[-1])
    src, dst, train = arrays(synthetic_dataset)
    num_nodes = len(train)
    assignment = load_assignment(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(assignment) == num_nodes and 0 <= assignment.min() and assignment.max() < num_parts
    assert manifest["slices"][0][0] == 0 and manifest["slices"][-1][1] == num_nodes and len(manifest["ranks"]) == ranks
    nodes = np.bincount(assignment, minlength=num_parts)
    assert nodes.max() <= (1 + manifest["imbalance"]) * num_nodes / num_parts + 1
    # The manifest's counts are the assignment's: owned nodes, their in-edges, their training nodes.
    edges = np.bincount(assignment[dst], minlength=num_parts)
    assert [[p["nodes"], p["edges"], p["train_nodes"]] for p in manifest["parts"]] == [
        [int(n), int(e), int(t)] for n, e, t in zip(nodes, edges, np.bincount(assignment[train], minlength=num_parts))]
    cut = pair_cut(assignment, src, dst)
    assert result["edge_cut"] == manifest["edge_cut"] and manifest["edge_cut"]["pairs"] == cut
    # The kit's METIS on the same graph, balancing node counts as PT-Scotch does here.
    metis_cut = pair_cut(leanpart.metis_parts([src.copy(), dst.copy()], num_nodes, None, num_parts, False), src, dst)
    assert cut <= 1.3 * metis_cut, (cut, metis_cut)
    assert cut < 0.5 * pair_cut(leanpart.random_parts(num_nodes, num_parts), src, dst)


@pytest.mark.parametrize("ranks", [2, 4])
def test_assignment_reads_a_chunked_graph(tmp_path, ranks):
    """DGL's chunked format, heterogeneous (every type in homogeneous IDs), 5 chunks per edge type spread
    round robin: every node once, balanced, the cut within 1.3x of METIS's on the same homogeneous graph."""
    from dglkit import chunked

    root, out = tmp_path / "chunked", tmp_path / "assignment"
    build("chunked", "generate", "--out", root, "--dataset", "synthetic-hetero", "--num-chunks", 5,
          "--num-nodes", 3000, "--feat-dim", 4)
    mpirun(ranks, "mpiassign", "--chunked", root, "--out", out, "--num-parts", 2)
    graph = chunked.load(root)
    ends = [[], []]
    for etype in graph.edge_types:
        src_type, _, dst_type = etype.split(":")
        for chunk in range(len(graph.edge_chunks[etype])):
            for side, ids, ntype in zip(ends, chunked.read_edges(graph, etype, chunk), (src_type, dst_type)):
                side.append(ids + graph.node_offset(ntype))
    src, dst = (np.concatenate(side) for side in ends)
    num_nodes = sum(graph.num_nodes.values())
    assignment = load_assignment(out)
    assert len(assignment) == num_nodes and np.bincount(assignment).max() <= 1.03 * num_nodes / 2 + 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_edges"] == len(src) and manifest["edge_cut"]["pairs"] == pair_cut(assignment, src, dst)
    metis = leanpart.metis_parts([src.copy(), dst.copy()], num_nodes, None, 2, False)
    assert pair_cut(assignment, src, dst) <= 1.3 * pair_cut(metis, src, dst)


def test_degree_weights_balance_in_edges_and_a_rerun_repeats_the_assignment(synthetic_dataset, tmp_path):
    runs = [tmp_path / "first", tmp_path / "again"]
    for out in runs:
        mpirun(2, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", out, "--num-parts", 2, "--vertex-weight",
               "degree")
    _, dst, train = arrays(synthetic_dataset)
    assignment = load_assignment(runs[0])
    np.testing.assert_array_equal(load_assignment(runs[1]), assignment)
    nodes_and_edges = np.bincount(assignment, minlength=2) + np.bincount(assignment[dst], minlength=2)
    assert nodes_and_edges.max() <= 1.03 * nodes_and_edges.sum() / 2 + 1


def test_bad_input_fails_before_anything_is_written(tmp_path):
    proc = mpirun(2, "mpiassign", "--dataset-dir", tmp_path, "--out", tmp_path / "a", "--num-parts", 2, check=False)
    assert proc.returncode != 0 and "prepare --arrays" in proc.stderr and not (tmp_path / "a").exists()


@pytest.mark.parametrize("program", ["mpiassign", "mpibuild"])
def test_a_killed_rank_fails_the_run_and_leaves_nothing_to_trust(synthetic_dataset, tmp_path, program):
    """One rank killed while the ranks exchange edges (tiny rounds keep them at it for seconds): mpirun fails,
    no output directory appears, and a later run completes in spite of what the killed one left."""
    out = tmp_path / "out"
    args: tuple[object, ...] = ("--dataset-dir", synthetic_dataset, "--out", out)
    if program == "mpiassign":
        args += ("--num-parts", 2)
    else:
        mpirun(2, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", tmp_path / "assignment", "--num-parts", 2)
        args += ("--assignment", tmp_path / "assignment")
    launcher = subprocess.Popen(mpi_command(2, program, *args, "--batch-edges", 32), env=ENV,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = exchanging_rank(launcher.pid)
    victim.send_signal(signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0, stderr[-2000:]
    assert not out.exists()
    assert not (tmp_path / ".out.partial" / "manifest.json").exists()
    mpirun(2, program, *args)
    assert json.loads((out / "manifest.json").read_text())["complete"]
    assert not (tmp_path / ".out.partial").exists()


def exchanging_rank(mpirun_pid: int) -> psutil.Process:
    """A rank of mpirun's that has mapped the edges, i.e. that has started the exchange rounds."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(mpirun_pid).children(recursive=True):
            try:
                if any(m.path.endswith("/src.npy") for m in child.memory_maps()):
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.05)
    raise AssertionError("no rank mapped the edges within a minute")


@pytest.mark.parametrize("ranks, dataset", [(2, "directed_dataset"), (4, "synthetic_dataset")])
def test_parts_built_by_the_ranks_are_the_lean_builders_and_load_in_dgl(request, tmp_path, ranks, dataset):
    """Assignment on 2 ranks, parts on `ranks` (small rounds: ranks run out of edges at different rounds), then
    the lean builder on one host from the same assignment: the same files, counts and cut; DGL loads them."""
    synthetic_dataset = request.getfixturevalue(dataset)
    assignment_dir, out, lean = tmp_path / "assignment", tmp_path / "parts", tmp_path / "lean"
    mpirun(2, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", assignment_dir, "--num-parts", ranks)
    mpirun(ranks, "mpibuild", "--dataset-dir", synthetic_dataset, "--assignment", assignment_dir, "--out", out,
           "--batch-edges", 5000)
    lean.mkdir()
    counts = leanpart.build(synthetic_dataset / "graph.dgl", load_assignment(assignment_dir), lean, "graph", ranks,
                            "ptscotch")
    assert_same_files(out, lean, ranks)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["edge_cut"] == counts["edge_cut"]
    assert [{key: part[key] for key in counts["parts"][0]} for part in manifest["parts"]] == counts["parts"]
    graph = dgl.load_graphs(str(synthetic_dataset / "graph.dgl"))[0][0]
    owned_and_halo(out / "graph.json", graph)
    for part in range(ranks):
        part_graph, node_feats, *_ = dgl.distributed.load_partition(str(out / "graph.json"), part)
        assert int(part_graph.ndata["inner_node"].sum()) == manifest["parts"][part]["nodes"]
        assert set(node_feats) == {f"_N/{name}" for name in graph.ndata}


def test_each_rank_writes_its_parts_graphbolt_graph_as_dgls_conversion_does(synthetic_dataset, tmp_path):
    """--graphbolt: every rank converts its own part; the files and the config equal what DGL's
    dgl_partition_to_graphbolt (all parts in one process) makes of the same partition, and DGL loads them."""
    import torch

    assignment_dir, bolt, converted = tmp_path / "assignment", tmp_path / "bolt", tmp_path / "converted"
    mpirun(2, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", assignment_dir, "--num-parts", 2)
    mpirun(2, "mpibuild", "--dataset-dir", synthetic_dataset, "--assignment", assignment_dir, "--out", converted)
    mpirun(2, "mpibuild", "--dataset-dir", synthetic_dataset, "--assignment", assignment_dir, "--out", bolt,
           "--graphbolt")
    dgl.distributed.dgl_partition_to_graphbolt(str(converted / "graph.json"))
    assert json.loads((bolt / "graph.json").read_text()) == json.loads((converted / "graph.json").read_text())
    assert json.loads((bolt / "manifest.json").read_text())["graphbolt"]
    for part in range(2):
        ours, dgls = (torch.load(root / f"part{part}" / "fused_csc_sampling_graph.pt") for root in (bolt, converted))
        for field in ("csc_indptr", "indices"):
            assert getattr(ours, field).dtype == getattr(dgls, field).dtype
            assert torch.equal(getattr(ours, field), getattr(dgls, field)), field
        assert ours.node_attributes.keys() == dgls.node_attributes.keys() and ours.edge_attributes == dgls.edge_attributes
        assert all(torch.equal(ours.node_attributes[key], dgls.node_attributes[key]) for key in ours.node_attributes)
        assert ours.type_per_edge is None and dgls.type_per_edge is None
        graph, *_ = dgl.distributed.load_partition(str(bolt / "graph.json"), part, load_feats=False,
                                                    use_graphbolt=True)
        assert graph.total_num_nodes == len(ours.node_attributes[dgl.NID])


def test_build_refuses_an_assignment_for_another_number_of_ranks(synthetic_dataset, tmp_path):
    assignment_dir = tmp_path / "assignment"
    mpirun(2, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", assignment_dir, "--num-parts", 4)
    proc = mpirun(2, "mpibuild", "--dataset-dir", synthetic_dataset, "--assignment", assignment_dir, "--out",
                  tmp_path / "parts", check=False)
    assert proc.returncode == 2 and "run with mpirun -np 4" in proc.stderr and not (tmp_path / "parts").exists()


@pytest.fixture(scope="module")
def chunked_as_arrays(chunked_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chunked graph gathered on this host (edges in chunk order, node data) into a files dataset with arrays/:
    the arrays path's input for the same graph."""
    graph = chunked.load(chunks_of(chunked_dataset))
    chunks = range(graph.num_chunks)
    edges = np.concatenate([np.stack(chunked.read_edges(graph, "_N:_E:_N", c), 1) for c in chunks])
    data = {name: np.concatenate([chunked.read_node_data(graph, "_N", name, c) for c in chunks])
            for name in graph.node_data["_N"]}
    directory = tmp_path_factory.mktemp("gathered")
    np.savez(directory / "graph.npz", edges=edges, **data)
    build("prepare", "--dataset", "files", "--path", directory / "graph.npz", "--out", directory / "dataset", "--arrays")
    return directory / "dataset"


def chunks_of(dataset: Path) -> Path:
    return Path(json.loads((dataset / "dataset.json").read_text())["path"])


def test_a_chunked_graph_partitions_as_the_arrays_of_the_same_graph(chunked_dataset, chunked_as_arrays, tmp_path):
    """Each rank reads its chunks (3 on 2 ranks, 700 rows a round: the ranks run out of rows at different rounds)
    and sends each node's rows to its part: the same assignment and the same partition files as the arrays path
    on the same graph, and each node's data is its chunk's row by original ID."""
    for name, dataset in (("chunked", chunked_dataset), ("arrays", chunked_as_arrays)):
        mpirun(2, "mpiassign", "--dataset-dir", dataset, "--out", tmp_path / f"{name}-assignment", "--num-parts", 2)
        mpirun(2, "mpibuild", "--dataset-dir", dataset, "--assignment", tmp_path / f"{name}-assignment", "--out",
               tmp_path / name, "--batch-edges", 700)
    np.testing.assert_array_equal(load_assignment(tmp_path / "chunked-assignment"),
                                  load_assignment(tmp_path / "arrays-assignment"))
    assert_same_files(tmp_path / "chunked", tmp_path / "arrays", 2)
    manifest = json.loads((tmp_path / "chunked" / "manifest.json").read_text())
    assert manifest["dataset_fingerprint"] == json.loads((chunked_dataset / "dataset.json").read_text())["fingerprint"]
    orig = np.load(tmp_path / "chunked" / "orig_nids.npy")
    graph = chunked.load(chunks_of(chunked_dataset))
    for name in ("feat", "labels", "train_mask"):
        whole = np.concatenate([chunked.read_node_data(graph, "_N", name, c) for c in range(graph.num_chunks)])
        parts = [load_tensors(str(tmp_path / "chunked" / f"part{p}" / "node_feat.dgl"))[f"_N/{name}"].numpy()
                 for p in range(2)]
        np.testing.assert_array_equal(np.concatenate(parts), whole[orig])


@pytest.mark.parametrize("bad", ["edges", "feat"])
def test_a_bad_chunk_refuses_the_run_before_any_partitioning(chunked_dataset, tmp_path, bad):
    """Chunk 1 (rank 1's) has a node ID out of range, or a feature chunk a row short: every rank stops in its
    check phase, rank 0 prints rank 1's finding naming the file, and nothing is written."""
    root = tmp_path / "chunks"
    shutil.copytree(chunks_of(chunked_dataset), root)
    if bad == "edges":
        path = root / "edges" / "_N:_E:_N-1.csv"
        lines = path.read_text().splitlines()
        path.write_text("\n".join(["0 3000", *lines[1:]]) + "\n")
    else:
        path = root / "node_data" / "_N" / "feat-1.npy"
        np.save(path, np.load(path)[:-1])
    build("prepare", "--dataset", "chunked", "--path", root, "--out", tmp_path / "dataset")
    progress, out = tmp_path / "progress", tmp_path / "assignment"
    progress.mkdir()
    proc = subprocess.run(mpi_command(2, "mpiassign", "--dataset-dir", tmp_path / "dataset", "--out", out,
                                      "--num-parts", 2), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**ENV, "DGLKIT_MPI_PROGRESS": str(progress)}, timeout=300)
    assert proc.returncode == 2 and f"error: {path}: " in proc.stderr, proc.stderr[-3000:]
    assert [json.loads((progress / f"rank{r}.json").read_text())["phase"] for r in (0, 1)] == ["check", "check"]
    assert not out.exists() and not (tmp_path / ".assignment.partial").exists()


@pytest.fixture(scope="module")
def edge_data_dataset(chunked_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chunked graph with edge data (a float32 weight, int64 rows of two, a float from csv chunks), its one
    node and edge type named `item` and `item:links:item` in metadata.json (a homogeneous graph: DGL's _N,
    _N:_E:_N in the partition), prepared as a chunked dataset where it is."""
    directory = tmp_path_factory.mktemp("edge-data")
    root = directory / "chunks"
    shutil.copytree(chunks_of(chunked_dataset), root)
    meta = json.loads((root / "metadata.json").read_text())
    rng = np.random.default_rng(7)
    (root / "edge_data").mkdir()
    specs = {}
    for name, rows in (("weight", lambda n: rng.random(n, dtype=np.float32)),
                       ("pair", lambda n: rng.integers(0, 1000, (n, 2)))):
        for i, count in enumerate(meta["num_edges_per_chunk"][0]):
            np.save(root / "edge_data" / f"{name}-{i}.npy", rows(count))
        files = [f"edge_data/{name}-{i}.npy" for i in range(len(meta["num_edges_per_chunk"][0]))]
        specs[name] = {"format": {"name": "numpy"}, "data": files}
    for i, count in enumerate(meta["num_edges_per_chunk"][0]):  # a csv chunk per edge chunk too: one float column
        np.savetxt(root / "edge_data" / f"score-{i}.csv", rng.integers(0, 100, count) / 4, fmt="%.2f")
    specs["score"] = {"format": {"name": "csv"}, "data": [f"edge_data/score-{i}.csv"
                                                          for i in range(len(meta["num_edges_per_chunk"][0]))]}
    meta.update(node_type=["item"], edge_type=["item:links:item"], edges={"item:links:item": meta["edges"]["_N:_E:_N"]},
                node_data={"item": meta["node_data"]["_N"]}, edge_data={"item:links:item": specs})
    (root / "metadata.json").write_text(json.dumps(meta))
    build("prepare", "--dataset", "chunked", "--path", root, "--out", directory / "dataset")
    return directory / "dataset"


def inner_edge_data(config: Path, part: int, orig_eids: np.ndarray) -> dict[str, np.ndarray]:
    """A part's edge data as DGL's loader reads it, rows in original edge ID order, and those IDs (`ids`)."""
    g, _, edge_feats, *_ = dgl.distributed.load_partition(str(config), part)
    inner = g.edata["inner_edge"].numpy() == 1
    orig = orig_eids[np.sort(g.edata[dgl.EID].numpy()[inner])]  # edge data rows: the inner edges by new ID
    order = np.argsort(orig)
    return {"ids": orig[order], **{key: tensor.numpy()[order] for key, tensor in edge_feats.items()}}


def test_edge_data_goes_with_its_edges_where_partition_graph_and_the_lean_builder_put_it(edge_data_dataset, tmp_path,
                                                                                       monkeypatch):
    """Each rank sends each edge's data rows with the edge to its destination's part (700 edges a round: the ranks
    run out of edges at different rounds): every part's edge_feat.dgl holds its inner edges' rows under
    `_N:_E:_N/<name>`, the same files as the lean builder writes from the same chunks read whole (prepare --whole)
    for the same assignment, and, by original edge ID, the rows partition_graph stores in that part."""
    import dgl.distributed.partition as dgl_partition_module
    import torch

    chunks, assignment_dir = chunks_of(edge_data_dataset), tmp_path / "assignment"
    mpirun(2, "mpiassign", "--dataset-dir", edge_data_dataset, "--out", assignment_dir, "--num-parts", 2)
    mpirun(2, "mpibuild", "--dataset-dir", edge_data_dataset, "--assignment", assignment_dir, "--out", tmp_path / "mpi",
           "--batch-edges", 700)
    build("prepare", "--dataset", "chunked", "--path", chunks, "--out", tmp_path / "whole", "--whole")
    g = dgl.load_graphs(str(tmp_path / "whole" / "graph.dgl"))[0][0]
    assert set(g.edata) == {"weight", "pair", "score"} and g.edata["pair"].dtype == torch.int64
    assignment = load_assignment(assignment_dir).astype(np.int64)
    (tmp_path / "lean").mkdir()
    leanpart.build(tmp_path / "whole" / "graph.dgl", assignment, tmp_path / "lean", "graph", 2, "ptscotch")
    assert_same_files(tmp_path / "mpi", tmp_path / "lean", 2)
    monkeypatch.setattr(dgl_partition_module, "random_choice", lambda parts, nodes: torch.from_numpy(assignment))
    _, dgl_eids = dgl.distributed.partition_graph(g, "graph", 2, str(tmp_path / "dgl"), part_method="random",
                                                  return_mapping=True)
    ours_eids = np.load(tmp_path / "mpi" / "orig_eids.npy")
    for part in range(2):
        ours = inner_edge_data(tmp_path / "mpi" / "graph.json", part, ours_eids)
        theirs = inner_edge_data(tmp_path / "dgl" / "graph.json", part, dgl_eids.numpy())
        assert set(ours) == set(theirs) == {"ids", "_N:_E:_N/weight", "_N:_E:_N/pair", "_N:_E:_N/score"}
        assert len(ours["ids"])
        for key, rows in theirs.items():
            assert ours[key].dtype == rows.dtype, key
            np.testing.assert_array_equal(ours[key], rows)
        np.testing.assert_array_equal(ours["_N:_E:_N/weight"], g.edata["weight"].numpy()[ours["ids"]])


def test_edge_data_of_a_whole_read_with_arrays_goes_as_from_graph_dgl(edge_data_dataset, tmp_path):
    """The chunks read whole with --arrays (edge_<name>.npy beside node_<name>.npy): the mpi builder on those
    arrays (2 ranks, 700 edges a round) and `partition --builder distributed`, step by step, write the same files,
    edge data included, as the lean builder from graph.dgl for their assignments."""
    whole = tmp_path / "whole"
    build("prepare", "--dataset", "chunked", "--path", chunks_of(edge_data_dataset), "--out", whole, "--whole",
          "--arrays")
    assert sorted(json.loads((whole / "dataset.json").read_text())["arrays"]["edge_data"]) == ["pair", "score", "weight"]
    mpirun(2, "mpiassign", "--dataset-dir", whole, "--out", tmp_path / "assignment", "--num-parts", 2)
    mpirun(2, "mpibuild", "--dataset-dir", whole, "--assignment", tmp_path / "assignment", "--out", tmp_path / "mpi",
           "--batch-edges", 700)
    dist = tmp_path / "dist"
    build("partition", "--dataset-dir", whole, "--out", dist, "--num-parts", 2, "--builder", "distributed",
          "--step", "assign")
    assignments = {"mpi": load_assignment(tmp_path / "assignment"), "dist": np.load(dist / "assignment.npy")}
    for part in range(2):
        build("partition", "--dataset-dir", whole, "--out", dist, "--num-parts", 2, "--builder", "distributed",
              "--step", "part", "--part", part)
    build("partition", "--dataset-dir", whole, "--out", dist, "--num-parts", 2, "--builder", "distributed",
          "--step", "finish")
    for name, assignment in assignments.items():
        lean = tmp_path / f"lean-{name}"
        lean.mkdir()
        leanpart.build(whole / "graph.dgl", assignment, lean, "graph", 2, "ptscotch" if name == "mpi" else "metis")
        assert_same_files(tmp_path / name, lean, 2)
        assert all(len(load_tensors(str(lean / f"part{p}" / "edge_feat.dgl"))) == 3 for p in range(2))


EDGE_DATA_READER = """\
import json, sys
import dgl, torch
dgl.distributed.initialize("")
g = dgl.distributed.DistGraph("graph", part_config=sys.argv[1])
print(json.dumps({name: g.edata[name][torch.tensor(json.loads(sys.argv[2]))].tolist() for name in ("weight", "pair")}))
"""


def test_distgraph_serves_the_edge_data_the_builders_write(edge_data_dataset, tmp_path):
    """DGL's DistGraph (standalone: one part, in a child process) reads the edge data of a part written by the
    builders' writer (the lean builder's, from the chunks read whole): g.edata[name] of a few edges are the chunks'
    rows."""
    build("prepare", "--dataset", "chunked", "--path", chunks_of(edge_data_dataset), "--out", tmp_path / "whole",
          "--whole")
    g = dgl.load_graphs(str(tmp_path / "whole" / "graph.dgl"))[0][0]
    (tmp_path / "one").mkdir()
    leanpart.build(tmp_path / "whole" / "graph.dgl", np.zeros(g.num_nodes(), np.int64), tmp_path / "one", "graph", 1,
                   "random")
    ids = [0, 5, g.num_edges() - 1]  # one part: new edge IDs are the original ones
    proc = subprocess.run([sys.executable, "-c", EDGE_DATA_READER, str(tmp_path / "one" / "graph.json"), json.dumps(ids)],
                          capture_output=True, text=True, env={**ENV, "DGL_DIST_MODE": "standalone"},
                          stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {name: g.edata[name][ids].tolist() for name in ("weight", "pair")}

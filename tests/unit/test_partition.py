"""`dglkit partition`: real METIS partitions of the shared synthetic graph, mappings, manifest, GraphBolt."""

import json
import os
import shutil
from pathlib import Path

import dgl
import numpy as np
import pytest
from dgl.data.utils import load_tensors


def partition_args(dataset: Path, out: Path, num_parts: int, *extra: object) -> list[object]:
    return ["partition", "--dataset-dir", dataset, "--out", out, "--num-parts", num_parts, *extra]


@pytest.mark.parametrize("num_parts, builder", [(1, "lean"), (2, "lean"), (2, "dgl")])
def test_partitions_map_back_to_the_original_graph(make_partition, synthetic_dataset, num_parts, builder):
    part_config = make_partition(num_parts, builder=builder)
    out = part_config.parent
    config = json.loads(part_config.read_text())
    (graph,), _ = dgl.load_graphs(str(synthetic_dataset / "graph.dgl"))
    orig_nids, orig_eids = np.load(out / "orig_nids.npy"), np.load(out / "orig_eids.npy")
    np.testing.assert_array_equal(np.sort(orig_nids), np.arange(graph.num_nodes()))
    np.testing.assert_array_equal(np.sort(orig_eids), np.arange(graph.num_edges()))
    src, dst = (ids.numpy() for ids in graph.edges())
    for part, (begin, end) in enumerate(config["node_map"]["_N"]):
        owned = orig_nids[begin:end]
        feats = load_tensors(str(out / config[f"part-{part}"]["node_feats"]))
        for name in ("feat", "labels", "train_mask", "val_mask", "test_mask"):
            np.testing.assert_array_equal(feats[f"_N/{name}"].numpy(), graph.ndata[name].numpy()[owned])
        # Every edge of the partition graph is an original edge once both mappings are applied.
        (part_graph,), _ = dgl.load_graphs(str(out / config[f"part-{part}"]["part_graph"]))
        local_src, local_dst = part_graph.edges()
        new_src, new_dst = (part_graph.ndata[dgl.NID][ids].numpy() for ids in (local_src, local_dst))
        eids = orig_eids[part_graph.edata[dgl.EID].numpy()]
        np.testing.assert_array_equal(orig_nids[new_src], src[eids])
        np.testing.assert_array_equal(orig_nids[new_dst], dst[eids])


def test_manifest_counts_and_edge_cut(partition_1, partition_2, synthetic_dataset):
    dataset = json.loads((synthetic_dataset / "dataset.json").read_text())
    one, two = (json.loads((config.parent / "manifest.json").read_text()) for config in (partition_1, partition_2))
    assert one["complete"] and two["complete"] and two["dataset_fingerprint"] == dataset["fingerprint"]
    assert one["edge_cut"] == {"count": 0, "fraction": 0.0}
    # Communities give METIS something to find: far fewer crossing edges than a random split's half.
    assert 0 < two["edge_cut"]["fraction"] < 0.35
    for manifest in (one, two):
        assert sum(part["nodes"] for part in manifest["parts"]) == dataset["num_nodes"]
        assert sum(part["edges"] for part in manifest["parts"]) == dataset["num_edges"]
        assert sum(part["train_nodes"] for part in manifest["parts"]) == dataset["num_train"]
        assert set(manifest["timings"]) == {"assign_s", "build_s"}
        # One part at a time per core, as many as the memory holds (plenty for this graph).
        assert manifest["builders"] == min(len(os.sched_getaffinity(0)), manifest["num_parts"])
        assert manifest["peak_rss_mb"] > 0 and not manifest["graphbolt"]
    train = [part["train_nodes"] for part in two["parts"]]
    assert abs(train[0] - train[1]) < 0.1 * sum(train), "train mask not balanced"


def owned_and_halo(part_config: Path, graph) -> list[dict]:
    """Check DGL's ownership and one-hop halo invariants of every part against the original graph; return
    per part the owned and halo nodes and the edges (original IDs) for comparisons between builders."""
    config = json.loads(part_config.read_text())
    orig_nids, orig_eids = np.load(part_config.parent / "orig_nids.npy"), np.load(part_config.parent / "orig_eids.npy")
    node_map, edge_map = np.array(config["node_map"]["_N"]), np.array(config["edge_map"]["_N:_E:_N"])
    src, dst = (ids.numpy() for ids in graph.edges())
    parts = []
    for p in range(config["num_parts"]):
        part_graph, *_ = dgl.distributed.load_partition(str(part_config), p, load_feats=False)
        nid, inner = part_graph.ndata[dgl.NID].numpy(), part_graph.ndata["inner_node"].numpy().astype(bool)
        eid, inner_edge = part_graph.edata[dgl.EID].numpy(), part_graph.edata["inner_edge"].numpy().astype(bool)
        # Owned nodes come first, hold the part's contiguous range, and every node knows its owner.
        assert inner[:inner.sum()].all() and not inner[inner.sum():].any()
        np.testing.assert_array_equal(nid[inner], np.arange(*node_map[p]))
        owner = np.searchsorted(node_map[:, 1], nid, side="right")
        np.testing.assert_array_equal(part_graph.ndata["part_id"].numpy(), owner)
        # Inner edges: exactly the in-edges of owned nodes, with the part's contiguous edge ID range.
        local_src, local_dst = (ids.numpy() for ids in part_graph.edges())
        np.testing.assert_array_equal(inner_edge, inner[local_dst])
        np.testing.assert_array_equal(np.sort(eid[inner_edge]), np.arange(*edge_map[p]))
        owned = orig_nids[nid[inner]]
        in_edges = np.flatnonzero(np.isin(dst, owned))
        np.testing.assert_array_equal(np.sort(orig_eids[eid[inner_edge]]), in_edges)
        # Kept besides: the owned nodes' out-edges into other parts; halo: the other ends of both (the same nodes
        # when every edge has its reverse; partition_graph keeps both on a directed graph, test_mpihetero).
        out_edges = np.flatnonzero(np.isin(src, owned) & ~np.isin(dst, owned))
        halo = orig_nids[nid[~inner]]
        np.testing.assert_array_equal(np.sort(halo), np.setdiff1d(np.concatenate([src[in_edges], dst[out_edges]]), owned))
        kept = np.flatnonzero(np.isin(dst, owned) | np.isin(src, owned))
        np.testing.assert_array_equal(np.sort(orig_eids[eid]), kept)
        np.testing.assert_array_equal(orig_nids[nid[local_src]], src[orig_eids[eid]])
        np.testing.assert_array_equal(orig_nids[nid[local_dst]], dst[orig_eids[eid]])
        parts.append({"owned": set(owned.tolist()), "halo": set(halo.tolist())})
    return parts


def test_lean_and_dgl_builders_keep_the_same_invariants(make_partition, synthetic_dataset):
    """Both builders satisfy DGL's ownership and halo invariants; METIS cuts as well and balances as well."""
    (graph,), _ = dgl.load_graphs(str(synthetic_dataset / "graph.dgl"))
    lean, standard = make_partition(2, builder="lean"), make_partition(2, builder="dgl")
    lean_parts, standard_parts = owned_and_halo(lean, graph), owned_and_halo(standard, graph)
    # METIS sees the same graph with its adjacency in another order: other parts, but as good ones, so the
    # halos (what trainers fetch from other machines) are as large.
    halos = [sum(len(part["halo"]) for part in parts) for parts in (lean_parts, standard_parts)]
    assert abs(halos[0] - halos[1]) <= 0.15 * halos[1], halos
    manifests = [json.loads((config.parent / "manifest.json").read_text()) for config in (lean, standard)]
    cuts = [manifest["edge_cut"]["fraction"] for manifest in manifests]
    assert abs(cuts[0] - cuts[1]) <= 0.1 * cuts[1], f"lean cut {cuts[0]} vs partition_graph {cuts[1]}"
    for manifest in manifests:
        train = [part["train_nodes"] for part in manifest["parts"]]
        assert abs(train[0] - train[1]) < 0.1 * sum(train), "train mask not balanced"


def test_random_method_cuts_more_than_metis(cli, synthetic_dataset, partition_2, tmp_path):
    code, result, _ = cli(*partition_args(synthetic_dataset, tmp_path, 2, "--part-method", "random"))
    metis = json.loads((partition_2.parent / "manifest.json").read_text())["edge_cut"]["fraction"]
    assert code == 0 and result["edge_cut_fraction"] > 0.4 > metis


def test_rerun_is_noop_and_num_parts_change_repartitions(cli, synthetic_dataset, tmp_path):
    out = tmp_path / "parts"
    assert cli(*partition_args(synthetic_dataset, out, 2))[1]["changed"]
    stamp = (out / "part0" / "graph.dgl").stat().st_mtime_ns
    code, result, _ = cli(*partition_args(synthetic_dataset, out, 2))
    assert code == 0 and not result["changed"] and (out / "part0" / "graph.dgl").stat().st_mtime_ns == stamp
    code, result, _ = cli(*partition_args(synthetic_dataset, out, 1))
    assert code == 0 and result["changed"] and result["num_parts"] == 1
    assert not (out / "part1").exists(), "stale partition left behind"
    assert json.loads((out / "graph.json").read_text())["num_parts"] == 1
    shutil.rmtree(out / "part0")  # damaged by hand: rebuilt, not reported current
    assert cli(*partition_args(synthetic_dataset, out, 1))[1]["changed"] and (out / "part0").is_dir()


def test_dataset_change_repartitions(cli, tmp_path):
    dataset, out = tmp_path / "data", tmp_path / "parts"
    prepare = ["prepare", "--dataset", "synthetic", "--out", dataset, "--num-nodes", "400", "--feat-dim", "4"]
    assert cli(*prepare)[0] == 0
    first = cli(*partition_args(dataset, out, 2))[1]
    assert cli(*prepare, "--seed", "5")[1]["changed"]
    second = cli(*partition_args(dataset, out, 2))[1]
    assert second["changed"] and second["edge_cut_fraction"] != first["edge_cut_fraction"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset_fingerprint"] == json.loads((dataset / "dataset.json").read_text())["fingerprint"]


def test_graphbolt_partition_loads(partition_2_graphbolt):
    config = json.loads(partition_2_graphbolt.read_text())
    manifest = json.loads((partition_2_graphbolt.parent / "manifest.json").read_text())
    assert manifest["graphbolt"] and "graphbolt_s" in manifest["timings"]
    for part in range(2):
        assert (partition_2_graphbolt.parent / config[f"part-{part}"]["part_graph_graphbolt"]).is_file()
        graph = dgl.distributed.load_partition(str(partition_2_graphbolt), part, use_graphbolt=True)[0]
        dgl_graph = dgl.distributed.load_partition(str(partition_2_graphbolt), part)[0]
        assert (graph.total_num_nodes, graph.total_num_edges) == (dgl_graph.num_nodes(), dgl_graph.num_edges())
        assert (graph.node_attributes[dgl.NID] == dgl_graph.ndata[dgl.NID]).all()


def test_graphbolt_converts_a_current_dgl_partition(cli, synthetic_dataset, partition_2, tmp_path):
    out = tmp_path / "parts"
    shutil.copytree(partition_2.parent, out)
    stamp = (out / "part0" / "graph.dgl").stat().st_mtime_ns
    code, result, _ = cli(*partition_args(synthetic_dataset, out, 2, "--graph-name", "graph", "--graphbolt"))
    assert code == 0 and result["changed"] and result.get("converted") and result["graphbolt"]
    assert (out / "part0" / "graph.dgl").stat().st_mtime_ns == stamp, "re-partitioned instead of converting"
    assert all((out / f"part{part}" / "fused_csc_sampling_graph.pt").is_file() for part in range(2))
    assert not cli(*partition_args(synthetic_dataset, out, 2, "--graphbolt"))[1]["changed"]
    # GraphBolt partitions keep the DGL files, so asking for DGL format only is still a no-op.
    assert not cli(*partition_args(synthetic_dataset, out, 2))[1]["changed"]


@pytest.mark.parametrize("num_parts, message", [(0, "--num-parts must be between 1 and the 4000 nodes"),
                                                (4001, "--num-parts must be between 1 and the 4000 nodes")])
def test_bad_num_parts(cli, synthetic_dataset, tmp_path, num_parts, message):
    code, _, err = cli(*partition_args(synthetic_dataset, tmp_path / "parts", num_parts))
    assert code == 2 and message in err and not (tmp_path / "parts").exists()


def test_missing_dataset_and_foreign_out_dir(cli, synthetic_dataset, tmp_path):
    code, _, err = cli(*partition_args(tmp_path / "nope", tmp_path / "parts", 2))
    assert code == 2 and "is not a prepared dataset" in err and "dglkit prepare" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    code, _, err = cli(*partition_args(synthetic_dataset, tmp_path / "mine", 2))
    assert code == 2 and "not a dglkit partition" in err and (tmp_path / "mine" / "notes.txt").exists()
    code, _, err = cli(*partition_args(synthetic_dataset, tmp_path / "p", 2, "--graph-name", "a/b"))
    assert code == 2 and "--graph-name" in err


def test_cli_prints_result_last(dglkit, partition_2, synthetic_dataset):
    proc = dglkit(*partition_args(synthetic_dataset, partition_2.parent, 2))
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["changed"] is False and result["num_parts"] == 2 and result["part_config"] == str(partition_2)


def test_metis_input_is_the_graph_made_symmetric_without_loops_or_duplicates():
    from dglkit.leanpart import symmetric_graph, undirected_pairs

    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 300, 4000), rng.integers(0, 300, 4000)  # loops and duplicates included
    graph = symmetric_graph(undirected_pairs(src, dst, 300), 300)
    indptr, indices, _ = (ids.numpy() for ids in graph.adj_tensors("csc"))
    got = list(zip(indices.tolist(), np.repeat(np.arange(300), np.diff(indptr)).tolist()))
    want = {(a, b) for a, b in zip(src.tolist(), dst.tolist()) if a != b}
    assert len(got) == len(set(got)) and set(got) == want | {(b, a) for a, b in want}


def distributed(cli, dataset: Path, out: Path, num_parts: int, step: str, *extra: object) -> tuple[int, dict | None, str]:
    return cli(*partition_args(dataset, out, num_parts, "--builder", "distributed", "--step", step, *extra))


def test_distributed_builder_writes_what_the_lean_builder_writes(cli, synthetic_dataset, tmp_path):
    """Step by step as the workers run it, then the lean builder on the same assignment, one part at a time
    and both at once: the same files."""
    from dglkit import leanpart

    dist = tmp_path / "dist"
    code, _, err = distributed(cli, synthetic_dataset, dist, 2, "finish")
    assert code == 2 and "run --step assign first" in err and not dist.exists()
    assert distributed(cli, synthetic_dataset, dist, 2, "assign")[1]["changed"]
    assignment = np.load(dist / "assignment.npy")
    code, _, err = distributed(cli, synthetic_dataset, dist, 2, "finish")
    assert code == 2 and "parts [0, 1] of" in err
    for part in (1, 0):  # any order: every worker builds its own
        assert distributed(cli, synthetic_dataset, dist, 2, "part", "--part", part)[1]["part"] == part
    assert distributed(cli, synthetic_dataset, dist, 2, "finish")[1]["changed"]
    assert sorted(p.name for p in dist.iterdir()) == ["graph.json", "manifest.json", "orig_eids.npy",
                                                       "orig_nids.npy", "part0", "part1"]
    for step, extra in (("assign", ()), ("part", ("--part", 0)), ("finish", ())):
        assert not distributed(cli, synthetic_dataset, dist, 2, step, *extra)[1]["changed"]

    manifest = json.loads((dist / "manifest.json").read_text())
    for builders in (1, 2):
        lean = tmp_path / f"lean-{builders}"
        lean.mkdir()
        counts = leanpart.build(synthetic_dataset / "graph.dgl", assignment, lean, "graph", 2, "metis", builders)
        assert manifest["complete"] and manifest["edge_cut"] == counts["edge_cut"]
        assert [{key: part[key] for key in counts["parts"][0]} for part in manifest["parts"]] == counts["parts"]
        assert_same_files(dist, lean, 2)
    # And DGL reads it as a partition with its invariants.
    owned_and_halo(dist / "graph.json", dgl.load_graphs(str(synthetic_dataset / "graph.dgl"))[0][0])


def test_the_distributed_steps_name_their_phases_and_the_workers_their_part(cli, synthetic_dataset, tmp_path,
                                                                          monkeypatch):
    """What the polls of `dglkit follow` show while each worker builds its part (their lines come without the host:
    the part says whose) and while the storage host finishes."""
    from dglkit.progress import PROGRESS

    phases: list[tuple[str, str]] = []
    monkeypatch.setattr(PROGRESS, "write", lambda: phases.append((PROGRESS.record["command"], PROGRESS.record["phase"])))
    dist = tmp_path / "dist"
    assert distributed(cli, synthetic_dataset, dist, 2, "assign")[0] == 0
    phases.clear()
    for part in (1, 0):
        assert distributed(cli, synthetic_dataset, dist, 2, "part", "--part", part)[0] == 0
    assert phases == [("partition", phase) for part in (1, 0) for phase in (
        "start", f"part {part} of 2: lay out the assignment", f"part {part} of 2: read its node data, write its files")]
    phases.clear()
    assert distributed(cli, synthetic_dataset, dist, 2, "finish")[0] == 0
    assert phases == [("partition", "start"), ("partition", "lay out the assignment"),
                      ("partition", "write the ID mappings and config")]


def assert_same_files(got_dir: Path, want_dir: Path, num_parts: int) -> None:
    """Two partitions hold the same config, ID mappings, graphs (structure, node and edge data) and features."""
    assert json.loads((got_dir / "graph.json").read_text()) == json.loads((want_dir / "graph.json").read_text())
    for name in ("orig_nids.npy", "orig_eids.npy"):
        np.testing.assert_array_equal(np.load(got_dir / name), np.load(want_dir / name))
    for part in range(num_parts):
        (got,), _ = dgl.load_graphs(str(got_dir / f"part{part}" / "graph.dgl"))
        (want,), _ = dgl.load_graphs(str(want_dir / f"part{part}" / "graph.dgl"))
        for a, b in zip(got.edges(), want.edges()):
            assert torch_equal(a, b)
        for got_data, want_data in ((got.ndata, want.ndata), (got.edata, want.edata)):
            assert set(got_data) == set(want_data) and all(torch_equal(got_data[k], want_data[k]) for k in want_data)
        for name in ("node_feat.dgl", "edge_feat.dgl"):
            got_feats, want_feats = (load_tensors(str(d / f"part{part}" / name)) for d in (got_dir, want_dir))
            assert set(got_feats) == set(want_feats)
            assert all(torch_equal(got_feats[k], want_feats[k]) for k in want_feats)


def torch_equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


def test_distributed_builder_needs_arrays_and_steps(cli, tmp_path):
    dataset = tmp_path / "data"
    assert cli("prepare", "--dataset", "synthetic", "--out", dataset, "--num-nodes", "400", "--feat-dim", "4")[0] == 0
    code, _, err = distributed(cli, dataset, tmp_path / "parts", 2, "assign")
    assert code == 2 and "prepare the dataset with --arrays" in err
    code, _, err = cli(*partition_args(dataset, tmp_path / "parts", 2, "--builder", "distributed"))
    assert code == 2 and "--step" in err
    code, _, err = distributed(cli, dataset, tmp_path / "parts", 2, "part", "--part", 2)
    assert code == 2 and "--part between 0 and 1" in err and not (tmp_path / "parts").exists()


def test_prepare_then_partition_run_as_one_command_and_a_failure_stops_the_chain(dglkit, tmp_path):
    # As roles/dgl_dataset runs them: one process, a result line per command.
    dataset, out = tmp_path / "data", tmp_path / "parts"
    prepare = ["prepare", "--dataset", "synthetic", "--out", dataset, "--num-nodes", "400", "--feat-dim", "4"]
    proc = dglkit(*prepare, "--then", *partition_args(dataset, out, 2))
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [result["changed"] for result in results] == [True, True] and results[1]["num_parts"] == 2
    proc = dglkit(*prepare, "--then", *partition_args(dataset, out, 2))
    assert [json.loads(line)["changed"] for line in proc.stdout.splitlines() if line.startswith("{")] == [False, False]
    # A partition of a dataset that the first command could not prepare is never attempted.
    proc = dglkit("prepare", "--dataset", "files", "--out", tmp_path / "nothing", "--path", tmp_path / "missing",
                  "--then", *partition_args(tmp_path / "nothing", tmp_path / "parts-2", 1), check=False)
    assert proc.returncode == 2 and "dglkit prepare: error" in proc.stderr and "dglkit partition" not in proc.stderr
    assert not (tmp_path / "parts-2").exists()

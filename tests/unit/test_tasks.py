"""The built-in programs beyond GraphSAGE node classification, as real --local DGL jobs: RGCN on a heterogeneous
graph (learnt embeddings for featureless types) and link prediction; and their datasets and partitions."""

import gzip
import json
from pathlib import Path

import dgl
import numpy as np
import pytest
import torch

from localjob import build, kill_trainer_after, start_local_job

HETERO = ["--num-nodes", "3000", "--num-classes", "5", "--feat-dim", "16", "--train-frac", "0.3",
          "--val-frac", "0.2", "--test-frac", "0.3", "--seed", "3"]
LINKS = ["--num-nodes", "3000", "--avg-degree", "10", "--num-classes", "30", "--feat-dim", "16", "--seed", "3",
         "--val-edges-frac", "0.05", "--test-edges-frac", "0.05"]
RGCN_ARGS = ["--num-epochs", "6", "--lr", "0.01", "--weight-decay", "0.0001", "--save-predictions", "--save-embeddings"]
LINK_ARGS = ["--task", "link_prediction", "--num-epochs", "4", "--batch-size", "500", "--lr", "0.02", "--dropout", "0",
             "--num-hidden", "32", "--save-embeddings"]
RANDOM_RANKER_MRR = sum(1 / rank for rank in range(1, 102)) / 101  # rank uniform over 1 + 100 negatives


def local_job(part_config: Path, tmp_path_factory: pytest.TempPathFactory, name: str, *train_args: str,
              kills: tuple[int, int] | None = None) -> tuple[Path, list[dict]]:
    """A finished --local job (a server, 2 trainers): (job dir, metrics). With kills (a, b), trainer 1 is killed
    twice, each time resuming another way: once a epochs are checkpointed, and the job's one restart goes on; once b
    are, and with no restart left the job fails, then runs again as train.yml runs it with dgl_job_resume
    (`dglkit jobdir --resume true`: the failed run moves to history/1/, its checkpoint stays)."""
    job_dir = tmp_path_factory.mktemp("jobs") / name
    restarts = ["--max-restarts", 1, "--grace", 5, "--restart-wait", 30] if kills else []
    args = ["--batch-size", "100", "--num-hidden", "16", "--log-every", "5", "--seed", "1", *train_args]
    launch, _ = start_local_job(job_dir, part_config, "node0", *restarts, train_args=args)
    if kills:
        for epochs in kills:
            kill_trainer_after(job_dir, launch, epochs, "node0")
        assert launch.wait(timeout=120) != 0, (job_dir / "launch.out").read_text()[-3000:]
        build("jobdir", "--job-dir", job_dir, "--nodes", "node0", "--resume", "true", "--config", "{}", "--settings", "{}")
        launch, _ = start_local_job(job_dir, part_config, "node0", train_args=args)
    assert launch.wait(timeout=480) == 0, (job_dir / "launch.out").read_text()[-3000:]
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return job_dir, metrics


def one_part(dataset: Path, graph_name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parts") / graph_name
    build("partition", "--dataset-dir", dataset, "--out", out, "--num-parts", 1, "--graph-name", graph_name)
    return out / f"{graph_name}.json"


def assert_resumed(job_dir: Path, metrics: list[dict], epochs: int, kills: tuple[int, int]) -> list[dict]:
    """Both kills of local_job were resumed from the checkpoint: at most one epoch (the checkpoint interval) ran
    twice each time, and the curves hold every epoch once. Returns the two resume records."""
    for failed in ("history/1/attempts/1/FAILED", "history/1/FAILED"):  # the restarted attempt, the failed run
        assert json.loads((job_dir / failed).read_text())["process"] == "trainer-1", failed
    assert [m["epoch"] for m in metrics if m["event"] == "epoch"] == list(range(epochs))
    resumes = [m for m in metrics if m["event"] == "resume"]
    assert len(resumes) == 2, resumes
    for kill, resume, end in zip(kills, resumes, (kills[1], epochs)):
        assert kill - 1 <= resume["epoch"] < end, resumes
    return resumes


@pytest.fixture(scope="module")
def hetero_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "hetero"
    build("prepare", "--dataset", "synthetic-hetero", "--out", out, *HETERO)
    return out


@pytest.fixture(scope="module")
def hetero_partition_2(hetero_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parts") / "hetero2"
    build("partition", "--dataset-dir", hetero_dataset, "--out", out, "--num-parts", 2, "--graph-name", "dglkit_het")
    return out / "dglkit_het.json"


def test_synthetic_hetero_dataset(hetero_dataset):
    (g,), _ = dgl.load_graphs(str(hetero_dataset / "graph.dgl"))
    meta = json.loads((hetero_dataset / "dataset.json").read_text())
    assert meta["heterogeneous"] and meta["category"] == "paper" and meta["num_classes"] == 5
    assert sorted(g.ntypes) == ["author", "field_of_study", "institution", "paper"]
    assert {rel for _, rel, _ in g.canonical_etypes} == {
        "affiliated_with", "writes", "has_topic", "cites", "rev_affiliated_with", "rev_writes", "rev_has_topic",
        "rev_cites"}
    assert list(g.nodes["paper"].data["feat"].shape) == [3000, 16]
    assert all("feat" not in g.nodes[t].data for t in ("author", "field_of_study", "institution"))
    # Labels depend on the graph: a paper's fields of study mostly have its class (round robin by field id).
    papers, fields = (ids.numpy() for ids in g.edges(etype="has_topic"))
    labels = g.nodes["paper"].data["labels"].numpy()
    agreement = (labels[papers] == fields % 5).mean()
    assert agreement > 0.6, agreement  # 0.2 if fields were random


def test_hetero_partition_balances_training_papers_and_maps_ids_per_type(hetero_dataset, hetero_partition_2):
    (g,), _ = dgl.load_graphs(str(hetero_dataset / "graph.dgl"))
    manifest = json.loads((hetero_partition_2.parent / "manifest.json").read_text())
    train = [part["train_nodes"] for part in manifest["parts"]]
    assert sum(train) == int(g.nodes["paper"].data["train_mask"].sum()) and abs(train[0] - train[1]) <= 0.1 * sum(train)
    assert 0 < manifest["edge_cut"]["fraction"] < 0.5
    orig_nids = np.load(hetero_partition_2.parent / "orig_nids.npz")
    assert sorted(orig_nids.files) == sorted(g.ntypes)
    # Part i's paper features, put back through the mapping, are the original papers' features.
    config = json.loads(hetero_partition_2.read_text())
    parts = [dgl.data.utils.load_tensors(str(hetero_partition_2.parent / f"part{i}/node_feat.dgl")) for i in range(2)]
    partitioned = np.concatenate([part["paper/feat"].numpy() for part in parts])
    assert not (orig_nids["paper"] == np.arange(len(orig_nids["paper"]))).all()
    restored = np.empty_like(partitioned)
    restored[orig_nids["paper"]] = partitioned
    np.testing.assert_array_equal(restored, g.nodes["paper"].data["feat"].numpy())
    assert sorted(np.load(hetero_partition_2.parent / "orig_eids.npz").files) == sorted(config["etypes"])


@pytest.fixture(scope="module")
def hetero_partition_1(hetero_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_part(hetero_dataset, "dglkit_het1", tmp_path_factory)


@pytest.fixture(scope="module")
def rgcn_job(hetero_partition_1: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    return local_job(hetero_partition_1, tmp_path_factory, "rgcn", *RGCN_ARGS)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_rgcn_learns_featureless_types_and_writes_outputs_in_original_ids(hetero_dataset, rgcn_job):
    job_dir, metrics = rgcn_job
    epochs, test = [m for m in metrics if m["event"] == "epoch"], metrics[-1]
    assert len(epochs) == 6 and test["event"] == "test"
    assert test["best_test_acc"] > 0.6 and test["best_val_acc"] == max(m["val_acc"] for m in epochs), test  # chance 0.2
    result = json.loads((job_dir / "result.json").read_text())
    assert result["category"] == "paper" and result["featureless_types"] == ["author", "field_of_study", "institution"]
    assert result["weight_decay"] == 0.0001 and result["seed"] == 1

    (g,), _ = dgl.load_graphs(str(hetero_dataset / "graph.dgl"))
    labels, test_mask = g.nodes["paper"].data["labels"].numpy(), g.nodes["paper"].data["test_mask"].numpy() > 0
    predictions = np.load(job_dir / "predictions.npy")
    # In original paper order the predictions match the labels as well as the test accuracy says; in any other
    # order they would match at chance.
    assert predictions.shape == (3000,) and (predictions[test_mask] == labels[test_mask]).mean() > 0.6
    embeddings = np.load(job_dir / "embeddings.npz")
    assert {t: embeddings[t].shape for t in embeddings.files} == {
        "paper": (3000, 16), "author": (1500, 16), "field_of_study": (30, 16), "institution": (15, 16)}
    assert (job_dir / "model.pt").is_file() and (job_dir / "model-best.pt").is_file()


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_rgcn_resumes_with_its_learnt_embeddings_after_a_trainer_is_killed(hetero_partition_1, rgcn_job,
                                                                         tmp_path_factory):
    """Through the launcher's restart, then through dgl_job_resume after the job failed."""
    kills = (2, 4)  # after these many checkpointed epochs
    job_dir, metrics = local_job(hetero_partition_1, tmp_path_factory, "rgcn-killed", *RGCN_ARGS, kills=kills)
    resumed = assert_resumed(job_dir, metrics, 6, kills)
    # Every row of the three featureless types' embeddings (1500 + 30 + 15) came back with its optimizer state.
    assert "with 1545 rows of learnt embeddings" in (job_dir / "nodes/node0/trainer-0.log").read_text()
    assert sorted(p.name for p in (job_dir / "checkpoint-sparse").iterdir()) == ["5-0.pt", "5-1.pt"]
    # As good as the uninterrupted run with the same seed, within the noise of two trainers' interleaved sampling
    # requests to the servers (runs of the same job ended 0.06 apart here).
    uninterrupted = rgcn_job[1][-1]["best_test_acc"]
    assert metrics[-1]["best_test_acc"] > max(0.6, uninterrupted - 0.1), (metrics[-1], uninterrupted, resumed)


@pytest.fixture(scope="module")
def link_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "links"
    build("prepare", "--dataset", "synthetic", "--out", out, *LINKS)
    return out


def test_held_out_edges_leave_the_graph_and_reverses_sit_half_way(link_dataset):
    (g,), _ = dgl.load_graphs(str(link_dataset / "graph.dgl"))
    meta = json.loads((link_dataset / "dataset.json").read_text())
    src, dst = (ids.numpy() for ids in g.edges())
    half = len(src) // 2
    assert (src[:half] == dst[half:]).all() and (dst[:half] == src[half:]).all()
    split = np.load(link_dataset / "edge_split.npz")
    n = g.num_nodes()
    in_graph = set((src * n + dst).tolist())
    for name in ("val", "test"):
        pairs = split[f"{name}_src"] * n + split[f"{name}_dst"]
        assert len(pairs) == meta["held_out_edges"][name] > 0
        reversed_pairs = split[f"{name}_dst"] * n + split[f"{name}_src"]
        assert not in_graph & set(pairs.tolist()) and not in_graph & set(reversed_pairs.tolist())


@pytest.fixture(scope="module")
def link_partition_1(link_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_part(link_dataset, "dglkit_lp", tmp_path_factory)


@pytest.fixture(scope="module")
def link_job(link_partition_1: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    return local_job(link_partition_1, tmp_path_factory, "lp", *LINK_ARGS)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_link_prediction_ranks_held_out_edges_well_above_random(link_job):
    job_dir, metrics = link_job
    epochs, test = [m for m in metrics if m["event"] == "epoch"], metrics[-1]
    assert len(epochs) == 4 and all({"loss", "val_mrr", "val_hits1", "val_hits3", "val_hits10"} <= set(m) for m in epochs)
    assert test["event"] == "test" and test["best_test_mrr"] > 2 * RANDOM_RANKER_MRR, (test, RANDOM_RANKER_MRR)
    assert 0 <= test["best_test_hits1"] <= test["best_test_hits3"] <= test["best_test_hits10"] <= 1
    assert np.load(job_dir / "embeddings.npy").shape == (3000, 32)


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_link_prediction_resumes_from_its_checkpoint_after_a_trainer_is_killed(link_partition_1, link_job,
                                                                               tmp_path_factory):
    """Through the launcher's restart, then through dgl_job_resume after the job failed."""
    kills = (1, 2)  # after these many checkpointed epochs
    job_dir, metrics = local_job(link_partition_1, tmp_path_factory, "lp-killed", *LINK_ARGS, kills=kills)
    assert_resumed(job_dir, metrics, 4, kills)
    uninterrupted = link_job[1][-1]["best_test_mrr"]
    assert metrics[-1]["best_test_mrr"] > max(2 * RANDOM_RANKER_MRR, 0.8 * uninterrupted), (metrics[-1], uninterrupted)


def test_link_prediction_draws_a_batchs_negatives_from_one_pool_as_large_as_the_batch():
    from dglkit.linkpred import PooledUniform

    g = dgl.rand_graph(1_000_000, 5000)  # so many nodes that 5 independent draws per edge would hardly repeat
    eids = torch.arange(200)
    src, dst = PooledUniform(5)(g, eids)
    assert torch.equal(src, g.find_edges(eids)[0].repeat_interleave(5))
    # Negative nodes are what the batch samples neighbourhoods for: one per edge, not one per negative.
    assert len(dst) == 1000 and len(torch.unique(dst)) <= 200 and int(dst.max()) < g.num_nodes()


def test_link_prediction_needs_held_out_edges(dglkit, partition_1, tmp_path):
    (tmp_path / "ip_config.txt").write_text("127.0.0.1 30050\n")
    proc = dglkit("train", "--task", "link_prediction", "--ip-config", tmp_path / "ip_config.txt",
                  "--part-config", partition_1, check=False, timeout=120)
    assert proc.returncode == 2 and "holds out no edges" in proc.stderr and "--val-edges-frac" in proc.stderr


def test_link_prediction_rejects_heterogeneous_graphs(cli, hetero_dataset, tmp_path):
    code, _, err = cli("prepare", "--dataset", "synthetic-hetero", "--out", tmp_path / "o", *HETERO,
                       "--val-edges-frac", "0.1", "--test-edges-frac", "0.1")
    assert code == 2 and "homogeneous graphs only" in err


def write_hetero_files(root: Path) -> None:
    rng = np.random.default_rng(0)
    (root / "nodes" / "item").mkdir(parents=True)
    (root / "nodes" / "user").mkdir(parents=True)
    (root / "edges").mkdir()
    (root / "num_nodes.json").write_text(json.dumps({"item": 6, "user": 4}))
    np.save(root / "nodes" / "item" / "feat.npy", rng.random((6, 3)))
    np.save(root / "nodes" / "item" / "labels.npy", np.array([0, 1, 0, 1, 2, 2]))
    np.save(root / "edges" / "user___buys___item.npy", np.array([[0, 0], [1, 1], [2, 2], [3, 3], [0, 5]]))
    np.savetxt(root / "edges" / "item___similar___item.csv", np.array([[0, 1], [2, 3], [4, 5]]), fmt="%d", delimiter=",")


def test_hetero_files(cli, tmp_path):
    write_hetero_files(tmp_path / "in")
    code, result, err = cli("prepare", "--dataset", "files", "--path", tmp_path / "in", "--out", tmp_path / "out",
                            "--train-frac", "0.5", "--val-frac", "0.2", "--test-frac", "0.3")
    assert code == 0, err
    (g,), _ = dgl.load_graphs(str(tmp_path / "out" / "graph.dgl"))
    assert g.num_nodes("item") == 6 and g.num_nodes("user") == 4 and "feat" not in g.nodes["user"].data
    assert g.num_edges("buys") == 5 and g.num_edges("rev_buys") == 5 and g.num_edges("rev_similar") == 3
    assert int(g.nodes["item"].data["train_mask"].sum()) == 3
    meta = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert meta["category"] == "item" and meta["node_types"]["user"] == {"num_nodes": 4, "feat_dim": 0}


@pytest.mark.parametrize("change, message", [
    (lambda root: (root / "nodes" / "user" / "labels.npy").write_bytes((root / "nodes" / "item" / "labels.npy").read_bytes()),
     "exactly one node type needs nodes/<type>/labels.npy"),
    (lambda root: np.save(root / "edges" / "user___buys___item.npy", np.array([[0, 6]])), "item ids must be in [0, 6)"),
    (lambda root: np.save(root / "edges" / "user__buys.npy", np.array([[0, 1]])), "edge files are named"),
    (lambda root: np.save(root / "nodes" / "item" / "train_mask.npy", np.ones(6, bool)), "give all of"),
    (lambda root: (root / "num_nodes.json").write_text("[1, 2]"), "must map node types to counts"),
])
def test_hetero_files_bad_inputs(cli, tmp_path, change, message):
    write_hetero_files(tmp_path / "in")
    change(tmp_path / "in")
    code, _, err = cli("prepare", "--dataset", "files", "--path", tmp_path / "in", "--out", tmp_path / "out")
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def write_ogbn_mag(root: Path) -> dict:
    """A tiny ogbn-mag in ogb's raw layout (what the official mag.zip holds, much smaller)."""
    rng = np.random.default_rng(0)
    base = root / "ogbn_mag"
    counts = {"author": 5, "field_of_study": 3, "institution": 2, "paper": 8}
    relations = {("author", "affiliated_with", "institution"): [[0, 0], [1, 1], [2, 1], [3, 0], [4, 1]],
                 ("author", "writes", "paper"): [[0, 0], [1, 1], [2, 2], [3, 3], [4, 4], [0, 5], [1, 6], [2, 7]],
                 ("paper", "cites", "paper"): [[0, 1], [2, 3], [4, 5], [6, 7]],
                 ("paper", "has_topic", "field_of_study"): [[i, i % 3] for i in range(8)]}

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.write(text)

    def rows(values) -> str:
        return "".join(",".join(str(v) for v in np.atleast_1d(row)) + "\n" for row in values)

    write(base / "raw" / "num-node-dict.csv.gz", ",".join(counts) + "\n" + ",".join(map(str, counts.values())) + "\n")
    write(base / "raw" / "triplet-type-list.csv.gz", rows(relations))
    for (src, rel, dst), edges in relations.items():
        folder = base / "raw" / "relations" / f"{src}___{rel}___{dst}"
        write(folder / "edge.csv.gz", rows(edges))
        write(folder / "num-edge-list.csv.gz", f"{len(edges)}\n")
        write(folder / "edge_reltype.csv.gz", rows([0] * len(edges)))
    feat, labels = rng.random((8, 4)).round(3), np.array([0, 1, 2, 0, 1, 2, 0, 1])
    write(base / "raw" / "node-feat" / "paper" / "node-feat.csv.gz", rows(feat))
    write(base / "raw" / "node-feat" / "paper" / "node_year.csv.gz", rows([2019] * 8))
    write(base / "raw" / "node-label" / "paper" / "node-label.csv.gz", rows(labels))
    has_paper = ",".join(counts) + "\n" + ",".join(str(t == "paper") for t in counts) + "\n"
    write(base / "raw" / "nodetype-has-label.csv.gz", has_paper)
    write(base / "split" / "time" / "nodetype-has-split.csv.gz", has_paper)
    split = {"train": [0, 1, 2, 3], "valid": [4, 5], "test": [6, 7]}
    for name, ids in split.items():
        write(base / "split" / "time" / "paper" / f"{name}.csv.gz", rows(ids))
    (base / "RELEASE_v2.txt").write_text("")
    return {"counts": counts, "feat": feat, "labels": labels, "split": split}


def test_ogbn_mag_offline(cli, tmp_path):
    fixture = write_ogbn_mag(tmp_path / "root")
    args = ["prepare", "--dataset", "ogbn-mag", "--data-root", tmp_path / "root", "--out", tmp_path / "out"]
    code, result, err = cli(*args)
    assert code == 0 and result["changed"], err
    (g,), _ = dgl.load_graphs(str(tmp_path / "out" / "graph.dgl"))
    assert {t: g.num_nodes(t) for t in g.ntypes} == fixture["counts"]
    assert g.num_edges("writes") == g.num_edges("rev_writes") == 8 and g.num_edges("rev_cites") == 4
    paper = g.nodes["paper"].data
    np.testing.assert_allclose(paper["feat"].numpy(), fixture["feat"], rtol=1e-6)
    assert (paper["labels"].numpy() == fixture["labels"]).all()
    for mask, key in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert np.flatnonzero(paper[mask].numpy()).tolist() == fixture["split"][key]
    meta = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert meta["category"] == "paper" and meta["node_types"]["author"]["feat_dim"] == 0
    assert not cli(*args)[1]["changed"]

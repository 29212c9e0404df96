"""dgl_job_partition_builder: mpi through train.yml on the jobs cluster after test_jobs (conftest.py's jobs_cluster:
node1 storage, node2 and node3 workers, each with its own venv; dglkit_mpi and dglkit_ssh_mesh on; the ranks talk over
the cluster's second network): a worker host cut off mid-partition fails the step naming it
and leaves no partition, and the next run writes no chunk again; with every host's memory capped below what
the single-host path needs for a graph whose features dominate, the workers write the synthetic graph chunk
by chunk (each its own chunk, the storage host metadata.json and dataset.json only: no host holds the graph),
the mpi builder partitions it from the chunks (each rank's memory checked first, each within its estimate),
and GraphSAGE trains on it; the single-host path on the same chunks is refused under those caps and, uncapped,
reads them whole, partitions them with METIS and trains to the same accuracy within noise; a user's
heterogeneous graph in DGL's chunked format is partitioned by the mpi builder and RGCN trains on it, and so it
does on the heterogeneous synthetic graph, which the workers write chunk by chunk.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from dglkit.settings import SETTINGS
from jobhelpers import JOBS_VENV, assert_clean, flat, kill, run_folder, start_train, train, working_set

if TYPE_CHECKING:
    from conftest import Cluster

WORKSPACE = "/srv/dglkit"
WORKERS = ["node2", "node3"]
# Features dominate (160k nodes x 2048 floats, 1.3 GB): the single-host path holds them all, a rank of the mpi
# builder, a server and a trainer their part's. Few, small batches keep the training short.
WIDE = ["-e", "dgl_job_synthetic_nodes=160000", "-e", "dgl_job_synthetic_feat_dim=2048", "-e", "dgl_job_epochs=2",
        "-e", "dgl_job_batch_size=256", "-e", "dgl_job_fan_out=5,5", "-e", "dgl_job_poll_seconds=2",
        "-e", "dgl_job_progress_seconds=1"]
MPI = ["-e", "dgl_job_partition_builder=mpi"]
# A small graph of its own (another seed) for the host shut down mid-partition.
SMALL = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_synthetic_seed=7", "-e", "dgl_job_epochs=1",
         "-e", "dgl_job_poll_seconds=1"]

# Large enough that the assignment runs for a while (status and stop come during it).
MEDIUM = ["-e", "dgl_job_synthetic_nodes=400000", "-e", "dgl_job_synthetic_feat_dim=8", "-e", "dgl_job_synthetic_seed=11",
          "-e", "dgl_job_epochs=1", "-e", "dgl_job_poll_seconds=1"]


@pytest.fixture(scope="module")
def site(jobs_cluster: Cluster) -> Cluster:
    return jobs_cluster


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def partitions(cluster: Cluster) -> Path:
    return cluster.workspace / "partitions"


def test_a_worker_host_cut_off_mid_partition_fails_the_step_naming_it(site: Cluster, runs: Path) -> None:
    proc = start_train(site, runs, *SMALL, *MPI)
    # The cut comes as soon as both ranks run, whatever their step: the partition of a small graph takes
    # seconds, and the cut (the host frozen, then killed) must come before it ends.
    work = wait_for_ranks(site, proc, ("mpiassign", "mpibuild"))
    site.shutdown("node3", cut=True)
    try:
        output = ended(proc, "after node3 went down", 600)
    finally:
        site.boot("node3")
    assert proc.returncode != 0 and re.search(r"the mpi partition failed in its (assign|build) step on node3: ",
                                              flat(output)), output[-4000:]
    partition = work.name.removesuffix(".tmp")
    assert not (partitions(site) / partition).exists() and not (work / "partition" / "manifest.json").exists()
    chunks = chunk_manifests(site, work)
    # The next run removes what the failed one left and completes; the graph's chunks are not written again.
    # It samples with GraphBolt: each rank writes its part's GraphBolt graph too, and the trainers load those.
    run = train(site, runs, *SMALL, *MPI, "-e", "dgl_job_graphbolt=true")
    manifest = json.loads((partitions(site) / partition / "manifest.json").read_text())
    assert manifest["complete"] and manifest["graphbolt"], run.output[-3000:]
    assert "graphbolt       yes" in (run_folder(run.output) / "summary.txt").read_text()
    assert chunk_manifests(site, work) == chunks and len(chunks) == 2
    generated = run.output.split("Write each worker's chunk of the synthetic graph on that worker")[1].split("TASK")[0]
    assert "ok: [node2]" in generated and "ok: [node3]" in generated and "changed" not in generated, generated
    assert not work.exists()
    assert_clean(site)


def ended(proc: subprocess.Popen, after: str, timeout: float) -> str:
    """train.yml's output once it has ended (killed, and the test failed, when it does not within timeout)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        pytest.fail(f"train.yml did not end {after}:\n{kill(proc)[-4000:]}")


def chunk_manifests(cluster: Cluster, work: Path) -> dict[str, dict]:
    """The chunk manifests of the synthetic graph that the partition in `work` (<partition>.tmp) is of, with
    their modification times."""
    dataset = cluster.workspace / "datasets" / work.name.removesuffix(".tmp").removesuffix("-2p-mpi")
    return {p.name: {**json.loads(p.read_text()), "mtime": p.stat().st_mtime_ns}
            for p in (dataset / "chunks" / "manifests").glob("chunk-*.json")}


def wait_for_ranks(cluster: Cluster, proc: subprocess.Popen, programs: tuple[str, ...],
                   timeout: float = 600) -> Path:
    """The partition's work directory once both ranks of this run report running one of `programs`."""
    started, deadline = time.time(), time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for work in partitions(cluster).glob("*-mpi.tmp"):
            records = [read_record(path) for path in (work / "progress").glob("rank*.json")]
            if len(records) == 2 and all(r and r["program"] in programs and r["time"] > started for r in records):
                return work
        time.sleep(0.02)
    pytest.fail(f"no ranks of {programs} reported within {timeout:.0f} s: {(proc.communicate()[0] or '')[-3000:]}")


def read_record(path: Path) -> dict | None:
    """A rank's progress record; None while it is replaced (a rank renames a new one over it)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_status_shows_a_running_partition_and_stop_stops_it_leaving_no_rank(site: Cluster, runs: Path) -> None:
    """The partition's unit outlives an interrupted train.yml: status.yml shows each host's phase, stop.yml stops
    it (every rank on every worker goes) and train.yml, still watching, says it was stopped."""
    proc = start_train(site, runs, *MEDIUM, *MPI)
    work = wait_for_ranks(site, proc, ("mpiassign",))
    status = site.playbook("playbooks/status.yml")
    assert re.search(r"partition \(mpi\) running: (assign|build) \[node2 \w+ [^,\]]+, node3 \w+ ",
                     flat(status.output)), status.output[-3000:]
    assert status.changed_hosts() == []
    stopped = site.playbook("playbooks/stop.yml")
    assert stopped.changed_hosts() == ["node2"], stopped.output[-3000:]  # the first worker runs the unit
    output = ended(proc, "after stop.yml", 300)
    assert proc.returncode != 0 and re.search(r"the mpi partition was stopped \(SIGTERM: playbooks/stop.yml, or "
                                              r"systemctl stop of its unit\) in its (assign|build) step",
                                              flat(output)), output[-4000:]
    for host in WORKERS:
        ranks = site.ssh(host, "pgrep -u dglkit -a -f 'dglkit.mpi(assign|build)'", check=False).stdout
        assert not ranks.strip(), f"{host}: {ranks}"
    assert not (partitions(site) / work.name.removesuffix(".tmp")).exists()
    # Nothing to stop any more: a second stop changes nothing.
    assert site.playbook("playbooks/stop.yml").changed_hosts() == []


def test_capped_hosts_prepare_partition_and_train_with_mpi_as_the_single_host_path_on_the_same_graph(
        site: Cluster, runs: Path) -> None:
    from dglkit.resources import memory_estimate, mpi_rank_estimate

    nodes, feat_dim = 160_000, 2048  # WIDE's
    # What the single-host path needs for this graph by the kit's own estimates: its prepare (the graph read
    # whole) and its lean partition, whichever is more. The chunked generator's graph has somewhat fewer edges
    # than nodes x degree (duplicates dropped): a few MB less, within the 100 MB below.
    edges = nodes * int(SETTINGS["synthetic_degree"].default)
    single = max(memory_estimate(stage, nodes, edges, feat_dim, 2) for stage in ("prepare", "lean"))
    caps = {host: (working_set(site, host) + single - 100 * 2**20) // 2**20 for host in site.hosts()}
    for host, cap in caps.items():
        site.cap_memory(host, cap)
    try:
        # Every host capped: the workers write the graph chunk by chunk, the mpi builder partitions it, and the
        # job's servers and trainers train on it.
        mpi = train(site, runs, *WIDE, *MPI)
        folder = run_folder(mpi.output)
        partition = Path(json.loads((folder / "job.json").read_text())["part_config"]).parent
        same_graph = ["-e", "dgl_job_dataset=chunked",
                      "-e", f"dgl_job_chunked_path={WORKSPACE}/datasets/{partition.name.removesuffix('-2p-mpi')}/chunks"]
        # The single-host path on the same chunks is refused under the caps, before it writes anything.
        refused = train(site, runs, *WIDE, *same_graph, check=False)
    finally:
        for host in caps:
            site.cap_memory(host, 0)
    assert refused.returncode != 0 and re.search(r"needs about \d+\.\d GB of memory", flat(refused.output)), \
        refused.output[-4000:]
    # Uncapped, it reads them whole and partitions them with METIS on the storage host.
    single_host = train(site, runs, *WIDE, *same_graph)
    flat_output = flat(mpi.output)
    assert re.search(r"partition \(mpi\) running: (assign|build) \[node2 \w+ [^,\]]+, node3 \w+ ", flat_output), \
        mpi.output[-4000:]
    assert "partition (mpi) succeeded" in flat_output
    # Each chunk of 80k nodes x 2048 features takes seconds to make: its writer's progress shows.
    assert re.search(r"chunked: chunk [01] of 2: make and write its arrays, [0-5]/6 arrays", flat_output), \
        mpi.output[-4000:]
    assert partition.name.endswith("-2p-mpi")
    manifest = json.loads((partitions(site) / partition.name / "manifest.json").read_text())
    local = site.workspace / "datasets" / Path(manifest["dataset_dir"]).name
    chunked = json.loads((local / "dataset.json").read_text())
    sizes = chunked["num_nodes"], chunked["num_edges"], chunked["feat_dim"]
    rank = mpi_rank_estimate(*sizes, 2)
    result = json.loads((folder / "result.json").read_text())
    single_folder = run_folder(single_host.output)
    single_result = json.loads((single_folder / "result.json").read_text())
    single_partition = Path(json.loads((single_folder / "job.json").read_text())["part_config"]).parent
    single_manifest = json.loads((partitions(site) / single_partition.name / "manifest.json").read_text())
    # The run's figures beside its run folders (docs/claims.md quotes them).
    (runs / "mpi-figures.json").write_text(json.dumps({
        "chunks": [json.loads(p.read_text()) for p in sorted((local / "chunks" / "manifests").glob("*.json"))],
        "describe_peak_rss_mb": chunked["peak_rss_mb"], "ranks": manifest["parts"], "rank_estimate": rank,
        "single_host_estimate": single, "caps_mb": caps, "val_acc": result["val_acc"],
        "single_host_val_acc": single_result["val_acc"], "single_host_peak_rss_mb": single_manifest["peak_rss_mb"]},
        indent=1))
    assert_no_host_held_the_graph(site, Path(manifest["dataset_dir"]))
    assert rank < single and single_manifest["num_parts"] == 2
    # Every rank peaked within its estimate, below what the single-host path is estimated to need.
    assert manifest["complete"] and max(p["peak_rss_mb"] for p in manifest["parts"]) * 2**20 < rank, manifest["parts"]
    # Chance is 0.1 (10 classes); one graph, two partitions: the same accuracy within noise.
    assert result["val_acc"] > 0.3 and abs(result["val_acc"] - single_result["val_acc"]) < 0.05, (result, single_result)
    assert_clean(site)


def assert_no_host_held_the_graph(cluster: Cluster, dataset_dir: Path) -> None:
    """Worker r wrote chunk r, each process peaking below the graph's features alone; the storage host described
    it from metadata.json and the labels, one chunk at a time; nothing of the graph was written whole."""
    local = cluster.workspace / "datasets" / dataset_dir.name
    dataset = json.loads((local / "dataset.json").read_text())
    features_mb = dataset["num_nodes"] * dataset["feat_dim"] * 4 / 2**20
    chunks = [json.loads((local / "chunks" / "manifests" / f"chunk-{i}.json").read_text()) for i in (0, 1)]
    hostnames = [cluster.ssh(host, "hostname").stdout.strip() for host in WORKERS]
    assert [chunk["host"] for chunk in chunks] == hostnames, chunks
    assert all(chunk["peak_rss_mb"] < features_mb for chunk in chunks), (chunks, features_mb)
    assert dataset["format"] == "chunked" and dataset["peak_rss_mb"] < features_mb, dataset
    assert not (local / "graph.dgl").exists() and not (local / "arrays").exists()


def test_rgcn_trains_on_a_heterogeneous_chunked_graph_partitioned_with_mpi(site: Cluster, runs: Path) -> None:
    """A user's heterogeneous graph in DGL's chunked format on the shared workspace (ogbn-mag's types, labels on
    papers, written there by `dglkit chunked generate`), dgl_job_dataset=chunked with the mpi builder: the
    workers partition it with mpirun into DGL's heterogeneous parts, and RGCN trains on them, its predictions
    back in original paper IDs."""
    from dglkit import chunked

    graph = f"{WORKSPACE}/datasets/user-hetero-chunks"
    site.ssh("node1", f"runuser -u dglkit -- {JOBS_VENV}/bin/python -m dglkit chunked generate --out {graph} --dataset "
                      "synthetic-hetero --num-chunks 3 --num-nodes 6000 --num-classes 5 --feat-dim 16 --seed 3",
             timeout=300)
    run = train(site, runs, "-e", "dgl_job_dataset=chunked", "-e", f"dgl_job_chunked_path={graph}", *MPI,
                "-e", "dgl_job_epochs=4", "-e", "dgl_job_batch_size=100", "-e", "dgl_job_save_predictions=true",
                "-e", "dgl_job_poll_seconds=1")
    assert "partition (mpi) succeeded" in flat(run.output), run.output[-4000:]
    folder = run_folder(run.output)
    result = json.loads((folder / "result.json").read_text())
    assert result["category"] == "paper" and result["num_trainers"] == 2, result
    assert result["featureless_types"] == ["author", "field_of_study", "institution"], result
    assert result["best_test_acc"] > 0.5, result  # chance: 0.2
    partition = Path(json.loads((folder / "job.json").read_text())["part_config"]).parent
    assert partition.name.endswith("-2p-mpi"), partition
    local = partitions(site) / partition.name
    manifest = json.loads((local / "manifest.json").read_text())
    assert manifest["complete"] and manifest["heterogeneous"] and all(p["train_nodes"] for p in manifest["parts"])
    config = json.loads((local / Path(json.loads((folder / "job.json").read_text())["part_config"]).name).read_text())
    assert list(config["ntypes"]) == ["paper", "author", "institution", "field_of_study"], config["ntypes"]
    # In original paper order (orig_nids.npz put them back) the predictions match the chunks' labels as well as
    # the test accuracy says; in another order they would match at chance.
    chunks = chunked.load(site.workspace / "datasets" / Path(graph).name)
    labels, test = (np.concatenate([chunked.read_node_data(chunks, "paper", name, i) for i in range(3)])
                    for name in ("labels", "test_mask"))
    predictions = np.load(folder / "predictions.npy")
    assert len(predictions) == len(labels) and (predictions[test > 0] == labels[test > 0]).mean() > 0.5
    assert_clean(site)


def test_the_workers_write_the_heterogeneous_synthetic_graph_chunk_by_chunk_and_rgcn_trains_on_it(
        site: Cluster, runs: Path) -> None:
    """dgl_job_dataset=synthetic-hetero with the mpi builder: worker r writes chunk r of every type, the storage
    host metadata.json, and RGCN trains on the heterogeneous parts the workers build."""
    run = train(site, runs, "-e", "dgl_job_dataset=synthetic-hetero", *MPI, "-e", "dgl_job_synthetic_nodes=6000",
                "-e", "dgl_job_synthetic_classes=5", "-e", "dgl_job_synthetic_feat_dim=16", "-e", "dgl_job_epochs=4",
                "-e", "dgl_job_batch_size=100", "-e", "dgl_job_poll_seconds=1")
    assert "partition (mpi) succeeded" in flat(run.output), run.output[-4000:]
    folder = run_folder(run.output)
    result = json.loads((folder / "result.json").read_text())
    assert result["category"] == "paper" and result["best_test_acc"] > 0.5, result  # chance: 0.2
    partition = Path(json.loads((folder / "job.json").read_text())["part_config"]).parent
    manifest = json.loads((partitions(site) / partition.name / "manifest.json").read_text())
    assert partition.name.startswith("synthetic-hetero-") and manifest["heterogeneous"], manifest
    local = site.workspace / "datasets" / Path(manifest["dataset_dir"]).name
    chunks = chunk_manifests(site, partitions(site) / partition.name)
    hostnames = [site.ssh(host, "hostname").stdout.strip() for host in WORKERS]
    assert [chunks[f"chunk-{i}.json"]["host"] for i in (0, 1)] == hostnames, chunks
    assert not (local / "graph.dgl").exists() and not (local / "arrays").exists()
    assert_clean(site)

"""dgl_job_partition_builder: mpi through train.yml on a cluster of its own (node1 storage, node2 and node3
workers; dglkit_mpi and dglkit_ssh_mesh on): a worker host shut down mid-partition fails the step naming it
and leaves no partition; with every host's memory capped below what the single-host builder needs for a graph
whose features dominate, the mpi builder partitions it on the workers (each rank's memory checked first, each
within its estimate), and GraphSAGE then trains on it (caps lifted: the job's servers hold the parts, which takes
more than the caps) to the accuracy the single-host builder's partition gives the same graph and seed.

The dataset itself is prepared whole on the storage host before the caps, arrays included (the MPI programs
read the arrays `prepare --arrays` writes): under the caps its prepare step is a no-op.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobhelpers import assert_clean, flat, kill, run_folder, start_train, train, working_set

if TYPE_CHECKING:
    from conftest import Cluster

WORKSPACE = "/srv/dglkit"
VENV = f"{WORKSPACE}/venv"
WORKERS = ["node2", "node3"]
# Features dominate (160k nodes x 2048 floats, 1.3 GB): the single-host builder holds them all, a rank of the
# mpi builder its part's. Few, small batches keep the training short.
WIDE = ["-e", "dgl_job_synthetic_nodes=160000", "-e", "dgl_job_synthetic_feat_dim=2048", "-e", "dgl_job_epochs=2",
        "-e", "dgl_job_batch_size=256", "-e", "dgl_job_fan_out=5,5", "-e", "dgl_job_poll_seconds=2"]
MPI = ["-e", "dgl_job_partition_builder=mpi"]
# A small graph of its own (another seed) for the host shut down mid-partition.
SMALL = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_synthetic_seed=7", "-e", "dgl_job_epochs=1",
         "-e", "dgl_job_poll_seconds=1"]


@pytest.fixture(scope="module")
def site(cluster_factory: Callable[..., Cluster]) -> Cluster:
    cluster = cluster_factory("mpi", 3)
    (cluster.inventory / "group_vars/all/mpi.yml").write_text("dglkit_ssh_mesh: true\ndglkit_mpi: true\n")
    cluster.stand_up()
    return cluster


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def partitions(cluster: Cluster) -> Path:
    return cluster.workspace / "partitions"


def test_a_worker_host_shut_down_mid_partition_fails_the_step_naming_it(site: Cluster, runs: Path) -> None:
    proc = start_train(site, runs, *SMALL, *MPI)
    work = wait_for_build_ranks(site, proc)
    site.shutdown("node3")
    try:
        output, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail(f"train.yml did not end after node3 went down:\n{kill(proc)[-4000:]}")
    message = flat(output)
    assert proc.returncode != 0 and re.search(r"the mpi partition failed in its build step on node3: the SSH "
                                              r"connection to its Open MPI daemon closed", message), output[-4000:]
    partition = work.name.removesuffix(".tmp")
    assert not (partitions(site) / partition).exists() and not (work / "partition" / "manifest.json").exists()
    site.boot("node3")
    # The next run removes what the failed one left and completes.
    run = train(site, runs, *SMALL, *MPI)
    assert json.loads((partitions(site) / partition / "manifest.json").read_text())["complete"], run.output[-3000:]
    assert not work.exists()
    assert_clean(site)


def wait_for_build_ranks(cluster: Cluster, proc: subprocess.Popen, timeout: float = 600) -> Path:
    """The partition's work directory once both ranks of this run's build report (the assignment is done)."""
    started, deadline = time.time(), time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for work in partitions(cluster).glob("*-mpi.tmp"):
            records = [json.loads(p.read_text()) for p in (work / "progress").glob("rank*.json") if p.stat().st_size]
            if len(records) == 2 and all(r["program"] == "mpibuild" and r["time"] > started for r in records):
                return work
        time.sleep(0.2)
    pytest.fail(f"no build ranks reported within {timeout:.0f} s: {(proc.communicate()[0] or '')[-3000:]}")


def test_capped_hosts_partition_with_mpi_and_train_as_the_single_host_path(site: Cluster, runs: Path) -> None:
    from dglkit.resources import memory_estimate, mpi_rank_estimate

    single = train(site, runs, *WIDE)
    single_result = json.loads((run_folder(single.output) / "result.json").read_text())
    part_config = json.loads((run_folder(single.output) / "job.json").read_text())["part_config"]
    dataset_id = Path(part_config).parent.name.removesuffix("-2p")
    dataset = json.loads((site.workspace / "datasets" / dataset_id / "dataset.json").read_text())
    sizes = dataset["num_nodes"], dataset["num_edges"], dataset["feat_dim"]
    # The mpi builder reads the dataset's arrays: written here, uncapped (the lean run's prepare wrote none).
    site.ssh("node1", f"runuser -u dglkit -- {VENV}/bin/python -m dglkit prepare --dataset synthetic --out "
                      f"{WORKSPACE}/datasets/{dataset_id} --num-nodes 160000 --avg-degree 10 --num-classes 10 "
                      "--feat-dim 2048 --seed 0 --arrays", timeout=900)
    lean, rank = memory_estimate("lean", *sizes, 2), mpi_rank_estimate(*sizes, 2)
    assert rank < lean
    # Just below what the single-host builder needs: the most a host may have while it is refused.
    caps = {host: (working_set(site, host) + lean - 100 * 2**20) // 2**20 for host in site.hosts()}
    for host, cap in caps.items():
        site.cap_memory(host, cap)
    try:
        # The single-host builder is refused on the storage host under its cap ...
        refused = site.ssh("node1", f"runuser -u dglkit -- {VENV}/bin/python -m dglkit partition --dataset-dir "
                                    f"{WORKSPACE}/datasets/{dataset_id} --out {WORKSPACE}/partitions/capped --num-parts 2",
                           check=False, timeout=300)
        assert refused.returncode == 2 and "(--builder lean) needs about" in refused.stderr, refused.stderr
        # ... and the mpi builder partitions on the capped workers. The job's servers then hold the parts in
        # memory and its trainers fetch features: training, not partitioning, needs more than the caps here
        # (a trainer was OOM-killed under them), so they are lifted once the partition is complete.
        proc = start_train(site, runs, *WIDE, *MPI)
        manifest_path = site.workspace / "partitions" / f"{dataset_id}-2p-mpi" / "manifest.json"
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline and not (
                manifest_path.is_file() and json.loads(manifest_path.read_text()).get("complete")):
            time.sleep(0.2)
        partitioned_capped = manifest_path.is_file() and json.loads(manifest_path.read_text()).get("complete")
    finally:
        for host in caps:
            site.cap_memory(host, 0)
    try:
        output, _ = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        pytest.fail(f"train.yml did not end:\n{kill(proc)[-4000:]}")
    assert proc.returncode == 0 and partitioned_capped, output[-6000:]
    flat_output = flat(output)
    assert re.search(r"partition \(mpi\) running: (assign|build) \[node2 \w+ [^,\]]+, node3 \w+ ", flat_output), \
        output[-4000:]
    assert "partition (mpi) succeeded" in flat_output
    folder = run_folder(output)
    partition = Path(json.loads((folder / "job.json").read_text())["part_config"]).parent
    assert partition.name == f"{dataset_id}-2p-mpi"
    manifest = json.loads((site.workspace / "partitions" / partition.name / "manifest.json").read_text())
    # Every rank peaked within its estimate, below what the single-host builder is estimated to need.
    assert manifest["complete"] and max(p["peak_rss_mb"] for p in manifest["parts"]) * 2**20 < rank, manifest["parts"]
    result = json.loads((folder / "result.json").read_text())
    # Chance is 0.1 (10 classes); two partitions of the same graph train alike within noise.
    assert result["val_acc"] > 0.3 and abs(result["val_acc"] - single_result["val_acc"]) < 0.1, (result, single_result)
    assert_clean(site)

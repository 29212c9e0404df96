"""Memory estimates: `prepare` and `partition` refuse, before writing anything, a run the host cannot hold, and
the job's pre-flight a node that cannot hold its part while training."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dglkit.resources import GB, lean_builders, memory_estimate, training_estimate
from localjob import free_ports

APP = Path(__file__).resolve().parents[2] / "app"
MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")


def test_estimates_follow_the_measured_peaks():
    # products-dgl: 2.45M nodes, 123.7M edges, 100 features. partition_graph passed 21.6 GB before it was
    # stopped (BENCHMARKS.md); the lean builder is built to stay under 12 GB.
    nodes, edges = 2_449_029, 123_718_512
    assert memory_estimate("dgl", nodes, edges, 100) > 24 * GB
    assert memory_estimate("lean", nodes, edges, 100) < 12 * GB
    # Two parts built at once (2 cores): 9410 MB measured.
    assert 9.2 * GB < memory_estimate("lean", nodes, edges, 100, 2, builders=2) < 12 * GB
    # Features dominate (160k nodes x 2048, 1.5M edges): one builder peaked at 3025 MB, two at 4227 MB; each part
    # being built holds its node data about twice.
    wide = 160_000, 1_538_940, 2048
    assert 2.95 * GB < memory_estimate("lean", *wide, 2, builders=1) < 3.6 * GB
    assert 4.13 * GB < memory_estimate("lean", *wide, 2, builders=2) < 5 * GB
    # 1M nodes / 24M edges: partition_graph peaked at 5.5 GB, prepare at 1.6 GB.
    assert 5 * GB < memory_estimate("dgl", 1_000_000, 23_980_772, 100) < 7 * GB
    assert 1.5 * GB < memory_estimate("prepare", 1_000_000, 23_980_772, 100) < 2.5 * GB


def test_lean_builder_builds_parts_at_once_while_the_memory_holds_them():
    nodes, edges, cores = 2_449_029, 123_718_512, len(os.sched_getaffinity(0))
    one, two = (memory_estimate("lean", nodes, edges, 100, 2, builders) / GB for builders in (1, 2))
    assert lean_builders(nodes, edges, 100, 2, memory_gb=(one + two) / 2) == 1
    assert lean_builders(nodes, edges, 100, 2, memory_gb=two) == min(cores, 2)
    assert lean_builders(nodes, edges, 100, 2, memory_gb=0) == min(cores, 2)  # 0: no check
    assert lean_builders(nodes, edges, 100, 2, memory_gb=one / 2) == 1  # check_fits refuses this one


def test_prepare_refuses_a_graph_larger_than_the_memory_and_writes_nothing(cli, tmp_path):
    out = tmp_path / "data"
    code, _, err = cli("prepare", "--dataset", "synthetic", "--out", out, "--num-nodes", "2000000",
                       "--avg-degree", "25", "--feat-dim", "100", "--memory-gb", "2")
    assert code == 2 and not out.exists()
    assert "preparing 2000000 nodes" in err and "needs about 3.1 GB of memory" in err
    assert "has 2.0 GB available (--memory-gb)" in err and "storage host with more memory" in err


def test_partition_refusal_leaves_the_old_partition_alone(cli, synthetic_dataset, partition_2, tmp_path):
    out = tmp_path / "parts"
    assert cli("partition", "--dataset-dir", synthetic_dataset, "--out", out, "--num-parts", 2)[0] == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    code, _, err = cli("partition", "--dataset-dir", synthetic_dataset, "--out", out, "--num-parts", 1,
                       "--builder", "dgl", "--memory-gb", "0.5")
    assert code == 2 and "(--builder dgl) needs about 0.6 GB of memory" in err and "--builder lean" in err
    assert "--builder distributed (Ansible: dgl_job_partition_builder: distributed), about 0.6 GB here" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_distributed_estimates_spare_the_storage_host_the_features():
    # products-dgl on 4 workers: METIS on the structure alone on the storage host, a quarter of the
    # features on each worker; both below the single-host builder.
    nodes, edges = 2_449_029, 123_718_512
    lean, storage, worker = (memory_estimate(stage, nodes, edges, 100, 4) for stage in ("lean", "assign", "part"))
    assert storage < lean and worker < lean
    # Features dominate (20k nodes, 2000 features, the e2e test's graph): the storage host needs the
    # imports and METIS, about 0.2 GB less than the single-host builder.
    lean, storage = (memory_estimate(stage, 20_000, 190_000, 2000, 2) for stage in ("lean", "assign"))
    assert lean - storage > 0.15 * GB


@pytest.fixture
def memory_cgroup():
    """A cgroup v1 memory group of this machine, capped by the test (needs root and the v1 controller)."""
    if not os.access(MEMORY_CGROUPS, os.W_OK):
        pytest.skip("no writable cgroup v1 memory controller (needs root)")
    group = MEMORY_CGROUPS / f"dglkit-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    yield group
    group.rmdir()


def test_partition_refuses_under_a_real_cgroup_memory_limit(memory_cgroup, synthetic_dataset, tmp_path):
    """No --memory-gb: the limit comes from the kernel, as on a container or a MemoryMax= unit."""
    (memory_cgroup / "memory.limit_in_bytes").write_text(str(400 * 2**20))
    out = tmp_path / "parts"
    script = f'echo $$ > {memory_cgroup}/cgroup.procs && exec "$@"'
    proc = subprocess.run(["sh", "-c", script, "sh", sys.executable, "-m", "dglkit", "partition", "--dataset-dir",
                           synthetic_dataset, "--out", out, "--num-parts", "2"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(APP)}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "memory cgroup limit 0.4 GB" in proc.stderr and not out.exists()


def test_training_estimate_follows_the_measured_peak():
    # 160k nodes x 2048 features on 2 workers, one trainer: a worker's working set peaked at 2.5 GB (file cache
    # included) with 0.69 GB of node data and 31 MB of structure in its part.
    assert 2.3 * GB < training_estimate(int(0.69 * GB), 31 * 2**20, 1) < 3 * GB


def test_a_node_too_small_to_train_on_its_part_is_refused_unless_the_job_runs_there(memory_cgroup, partition_1,
                                                                                     tmp_path):
    """The pre-flight under a real cgroup memory limit: refused with the figures and the ways out; a job that
    runs on the node already (train.yml attaching to it) holds that memory, which is then not judged."""
    (memory_cgroup / "memory.limit_in_bytes").write_text(str(700 * 2**20))
    config = {"local": True, "part_config": str(partition_1), "job_dir": str(tmp_path / "job"),
              "server_port": free_ports(2), "master_port": free_ports(1)}
    code = ("import json, sys; from dglkit.launcher import preflight; config = json.loads(sys.argv[1]); "
            "print(json.dumps([preflight.check_ahead(config, 'n1', running) for running in (False, True)]))")
    script = f'echo $$ > {memory_cgroup}/cgroup.procs && exec "$@"'
    proc = subprocess.run(["sh", "-c", script, "sh", sys.executable, "-c", code, json.dumps(config)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(APP)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    refused, attached = json.loads(proc.stdout)
    assert refused["checked"] and "n1 needs about 1.0 GB of memory to train on part 0" in refused["error"], refused
    assert "memory cgroup limit 0.7 GB" in refused["error"] and "more workers (smaller parts)" in refused["error"]
    assert attached == {"checked": True, "error": None}

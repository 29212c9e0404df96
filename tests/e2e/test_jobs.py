"""Claims about jobs that the training tests leave open, on the jobs cluster (conftest.py's jobs_cluster: node1
storage, node2 and node3 workers) whose nodes talk over a second network (`dglkit_cluster_address` differs from
`ansible_host`) and each run their own venv (`dglkit_python_env_location: per_node`, none on the workspace), before
test_mpi_partition runs on it: outputs in original node order
across two partitions, samplers, the `files` and offline `ogbn-*` datasets through train.yml, `dgl_job_force`,
fail-fast across nodes with the controller gone, playbooks/preflight.yml, a launcher that
fails its own pre-flight, stop.yml's leftover report, a resize to 3 workers (ip_config, host keys, a GraphBolt job)
and back, and, last (it caps the storage host's memory), partitioning across the workers where the storage host
cannot alone.

The tests share the cluster and run in file order: each leaves every host clean for the next.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from jobhelpers import (
    JOBS_NODE_DIR,
    JOBS_SERVER_PORT,
    JOBS_VENV,
    assert_clean,
    flat,
    ip_config_of_workers,
    run_folder,
    start_train,
    stop_background,
    train,
    workers,
    working_set,
)

if TYPE_CHECKING:
    from conftest import Cluster

WORKSPACE = "/srv/dglkit"
# Fail-fast means fail-fast: no restart may hide the failure (the longjobs branch adds restarts).
NO_RESTARTS = ["-e", "dgl_job_max_restarts=0"]
JOB = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_epochs=3", "-e", "dgl_job_batch_size=100"]
ENDLESS = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_epochs=1000", "-e", "dgl_job_batch_size=100",
           "-e", "dgl_job_poll_seconds=5", *NO_RESTARTS]
# Every process, port and /dev/shm file of a failed job must be gone from every worker within this many
# seconds of the failure, with no playbook running. A correctness bound on a loaded machine, not a speed
# figure (bench/failure.py measures that: 1.3-2.7 s in BENCHMARKS.md).
FAIL_FAST_BOUND = 60
# A small graph for the files and ogbn datasets: classes that features and neighbours both point to.
SMALL_NODES, SMALL_CLASSES = 3000, 4


@pytest.fixture(scope="module")
def site(jobs_cluster: Cluster) -> Cluster:
    return jobs_cluster


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(autouse=True)
def stop_background_jobs(site: Cluster) -> Iterator[None]:
    yield
    stop_background(site)


def wait_for_epoch(cluster: Cluster, job_id: str, playbook: subprocess.Popen, timeout: float = 600) -> None:
    """Until the job's rank 0 has logged an epoch; fails at once, with its output, if train.yml ended first."""
    metrics = cluster.workspace / "jobs" / job_id / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if playbook.poll() is not None:
            pytest.fail(f"train.yml ended before job {job_id} logged an epoch:\n{playbook.communicate()[0][-4000:]}")
        if metrics.exists() and '"event": "epoch"' in metrics.read_text():
            return
        time.sleep(1)
    pytest.fail(f"job {job_id} logged no epoch within {timeout:.0f} s")


def status(cluster: Cluster, job_id: str, node: str) -> dict:
    return json.loads((cluster.workspace / "jobs" / job_id / "nodes" / node / "status.json").read_text())


def small_graph() -> dict[str, np.ndarray]:
    """Edges mostly inside a class, features = noisy one-hot of the class, labels."""
    rng = np.random.default_rng(7)
    labels = rng.integers(0, SMALL_CLASSES, SMALL_NODES)
    by_class = [np.flatnonzero(labels == c) for c in range(SMALL_CLASSES)]
    src = rng.integers(0, SMALL_NODES, SMALL_NODES * 8)
    dst = np.array([rng.choice(by_class[labels[s]]) if rng.random() < 0.8 else rng.integers(0, SMALL_NODES)
                    for s in src])
    feat = np.eye(SMALL_CLASSES)[labels] * 3 + rng.normal(size=(SMALL_NODES, SMALL_CLASSES))
    return {"edges": np.stack([src, dst], 1), "feat": feat.astype(np.float32), "labels": labels}


def write_ogbn_products(directory: Path, graph: dict[str, np.ndarray]) -> None:
    """ogb's on-disk layout of ogbn-products, as ogb would leave it after its own download."""
    def csv_gz(name: str, rows: np.ndarray) -> None:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as out:
            np.savetxt(out, np.asarray(rows).reshape(len(rows), -1), delimiter=",", fmt="%g")

    csv_gz("raw/edge.csv.gz", graph["edges"])
    csv_gz("raw/num-node-list.csv.gz", [SMALL_NODES])
    csv_gz("raw/num-edge-list.csv.gz", [len(graph["edges"])])
    csv_gz("raw/node-feat.csv.gz", graph["feat"])
    csv_gz("raw/node-label.csv.gz", graph["labels"])
    order = np.random.default_rng(8).permutation(SMALL_NODES)
    for name, ids in zip(("train", "valid", "test"), np.split(order, [SMALL_NODES // 2, SMALL_NODES * 3 // 4])):
        csv_gz(f"split/sales_ranking/{name}.csv.gz", ids)
    (directory / "RELEASE_v1.txt").write_text("")


def test_preflight_passes_on_a_healthy_cluster_and_changes_nothing(site: Cluster) -> None:
    run = site.playbook("playbooks/preflight.yml")
    assert sorted(run.recap) == sorted([*site.hosts(), "localhost"])
    assert run.changed_hosts() == [] and run.failed_hosts() == [], run.recap


# One sampler per trainer, outputs saved: the first job of the module, run again after the resize.
SAMPLED_JOB = [*JOB, "-e", "dgl_job_samplers=1", "-e", "dgl_job_save_predictions=true",
               "-e", "dgl_job_save_embeddings=true"]


def test_outputs_are_in_original_node_order_on_two_parts_with_samplers(site: Cluster, runs: Path) -> None:
    import dgl

    # One sampler per trainer: DGL_NUM_CLIENT counts them, so servers wait for them; the job only ends if
    # the samplers really connected.
    run = train(site, runs, *SAMPLED_JOB)
    folder = run_folder(run.output)
    # The job ran over the second network: ip_config.txt holds the cluster addresses, not ansible_host.
    assert (site.workspace / "ip_config.txt").read_text().splitlines() == ip_config_of_workers(site)
    assert not set(site.hosts().values()) & set(site.cluster_addresses().values())
    job = json.loads((folder / "job.json").read_text())
    assert job["num_samplers"] == 1 and Path(job["part_config"]).parent.name.endswith("-2p"), job
    result = json.loads((folder / "result.json").read_text())
    assert result["num_trainers"] == 2 and result["val_acc"] > 0.5, result
    dataset = Path(job["part_config"]).parent.name.removesuffix("-2p")
    (graph,), _ = dgl.load_graphs(str(site.workspace / "datasets" / dataset / "graph.dgl"))
    # The partitioner relabels nodes; on two parts that is far from the identity.
    orig_nids = np.load(site.workspace / Path(job["part_config"]).parent.relative_to(WORKSPACE) / "orig_nids.npy")
    assert (orig_nids != np.arange(len(orig_nids))).mean() > 0.5
    labels, test = graph.ndata["labels"].numpy(), graph.ndata["test_mask"].numpy().astype(bool)
    predictions = np.load(folder / "predictions.npy")
    embeddings = np.load(folder / "embeddings.npy")
    assert predictions.shape == (graph.num_nodes(),) and embeddings.shape[0] == graph.num_nodes()
    # Full-neighbour inference against sampled evaluation: close, not equal. A wrong order gives chance (0.1).
    saved_acc = (predictions[test] == labels[test]).mean()
    assert abs(saved_acc - result["test_acc"]) < 0.1, (saved_acc, result)
    assert_clean(site)


def test_every_host_has_its_own_venv_and_the_job_ran_with_it(site: Cluster, runs: Path) -> None:
    # The job above trained, and no venv exists on the workspace: it ran with the hosts' own.
    assert not (site.workspace / "venv").exists()
    for host in site.hosts():
        assert site.ssh(host, f"findmnt -no TARGET -T {JOBS_VENV}").stdout.split() == [JOBS_NODE_DIR], host
        site.ssh(host, f"test -x {JOBS_VENV}/bin/python && grep -qx {WORKSPACE}/app {JOBS_VENV}/lib/python3*/site-packages/"
                       "dglkit-app.pth")
    for host in workers(site):
        exec_start = next(line for line in site.ssh(host, "systemctl cat dglkit-job").stdout.splitlines()
                          if line.startswith("ExecStart="))
        # The unit's shell opens unit.log as the job account, then execs the launcher of the node's own venv.
        assert f"' {JOBS_VENV}/bin/python -m dglkit launch " in exec_start, exec_start


def test_files_dataset_trains_and_force_runs_a_finished_job_again(site: Cluster, runs: Path) -> None:
    graph = small_graph()
    (site.workspace / "inputs").mkdir(exist_ok=True)
    np.savez(site.workspace / "inputs" / "small.npz", **graph)
    files = ["-e", "dgl_job_dataset=files", "-e", f"dgl_job_files_path={WORKSPACE}/inputs/small.npz",
             "-e", "dgl_job_epochs=3", "-e", "dgl_job_batch_size=100"]
    folder = run_folder(train(site, runs, *files).output)
    job = json.loads((folder / "job.json").read_text())
    prepared = json.loads((site.workspace / "datasets" / Path(job["part_config"]).parent.name.removesuffix("-2p")
                           / "dataset.json").read_text())
    assert prepared["num_nodes"] == SMALL_NODES, prepared
    result = json.loads((folder / "result.json").read_text())
    assert result["num_classes"] == SMALL_CLASSES and result["val_acc"] > 0.5, result

    again = train(site, runs, *files)
    # The message, not the task's name: the task shows in every run's output, skipped or not.
    assert "finished before: fetching" in flat(again.output) and again.changed_hosts() == [], again.recap
    first_run = status(site, folder.name, "node2")["updated"]
    forced = train(site, runs, *files, "-e", "dgl_job_force=true")
    assert "finished before: fetching" not in flat(forced.output)
    assert re.search(r"succeeded: epoch 3/3 [^\]]*\[node2 succeeded, node3 succeeded\]", flat(forced.output))
    assert set(forced.changed_hosts()) >= set(workers(site)), forced.recap
    assert status(site, folder.name, "node2")["updated"] > first_run
    assert_clean(site)


def test_ogbn_dataset_from_pre_placed_files_with_no_route_out(site: Cluster, runs: Path) -> None:
    # The hosts have no route out (tests/e2e/test_harness.py checks it): a download attempt would fail.
    write_ogbn_products(site.workspace / "ogb" / "ogbn_products", small_graph())
    # ogb writes its processed/ copy next to the files: they belong to the job account, as datasets/ does.
    site.ssh("node1", f"chown -R --reference={WORKSPACE}/datasets {WORKSPACE}/ogb")
    run = train(site, runs, "-e", "dgl_job_dataset=ogbn-products", "-e", "dgl_job_epochs=3",
                "-e", "dgl_job_batch_size=100")
    folder = run_folder(run.output)
    result = json.loads((folder / "result.json").read_text())
    assert result["num_classes"] == SMALL_CLASSES and result["val_acc"] > 0.5, result
    job = json.loads((folder / "job.json").read_text())
    prepared = json.loads((site.workspace / "datasets" / Path(job["part_config"]).parent.name.removesuffix("-2p")
                           / "dataset.json").read_text())
    assert prepared["source"] == "ogbn-products" and prepared["num_nodes"] == SMALL_NODES, prepared
    # ogb read the files where they were and fetched nothing (no zip, no second directory).
    assert sorted(p.name for p in (site.workspace / "ogb").iterdir()) == ["ogbn_products"]
    assert (site.workspace / "ogb" / "ogbn_products" / "processed").is_dir()
    assert_clean(site)


def job_processes(cluster: Cluster, host: str, job_dir: str) -> list[str]:
    """What stop.yml's leftover check (dglkit.control.job_processes) finds of a job on a host."""
    command = f"{JOBS_VENV}/bin/python -c 'import json, sys; from dglkit.control import job_processes; " \
              f"print(json.dumps(job_processes(sys.argv[1])))' {job_dir}"
    return json.loads(cluster.ssh(host, command).stdout)


def fail_without_controller(site: Cluster, runs: Path, job_id: str, node: str, process: str) -> dict:
    """Start an endless job, SIGKILL its ansible-playbook (and everything it forked), then SIGKILL `process`
    (server-0, or the first trainer) on `node` and wait until no worker has anything of the job left.
    Returns the job's FAILED record."""
    proc = start_train(site, runs, *ENDLESS, "-e", f"dgl_job_id={job_id}")
    wait_for_epoch(site, job_id, proc)
    # While it runs, preflight.yml names the running job on every worker.
    preflight = site.playbook("playbooks/preflight.yml", check=False)
    assert preflight.failed_hosts() == workers(site), preflight.recap
    for host in workers(site):
        assert f"{host}: dglkit job {job_id} is active (dglkit-job.service)" in flat(preflight.output), \
            preflight.output[-4000:]
    # DGL's servers listen on the cluster network (the second one), nowhere else.
    for host in workers(site):
        listening = site.ssh(host, f"ss -Hltn 'sport = :{JOBS_SERVER_PORT}'").stdout.split()
        assert f"{site.cluster_addresses()[host]}:{JOBS_SERVER_PORT}" in listening, (host, listening)
        # Every process of the job's unit is one that stop.yml's leftover check finds.
        in_unit = {int(pid) for pid, unit in map(str.split, site.ssh(host, "ps -e -o pid=,unit=").stdout.splitlines())
                   if unit == "dglkit-job.service"}
        found = {int(line.split()[0]) for line in job_processes(site, host, f"{WORKSPACE}/jobs/{job_id}")}
        assert len(in_unit) >= 3 and in_unit <= found, (host, in_unit, found)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    started = {p["name"]: p["pid"] for p in status(site, job_id, node)["processes"]}
    site.ssh(node, f"kill -9 {started[process]}")
    killed = time.time()
    left: dict[str, dict] = {}
    while time.time() - killed < FAIL_FAST_BOUND:
        left = {host: site.leftovers(host) for host in workers(site)}
        if not any(left.values()):
            break
        time.sleep(1)
    assert not any(left.values()), (time.time() - killed, left)
    return json.loads((site.workspace / "jobs" / job_id / "FAILED").read_text())


def test_a_killed_server_stops_every_node_without_the_controller(site: Cluster, runs: Path) -> None:
    failed = fail_without_controller(site, runs, "clm-server", "node3", "server-0")
    assert (failed["node"], failed["process"]) == ("node3", "server-0"), failed
    assert failed["reason"] == "exited with signal SIGKILL", failed
    assert status(site, "clm-server", "node2")["state"] == "failed"


def test_a_killed_trainer_stops_every_node_without_the_controller(site: Cluster, runs: Path) -> None:
    failed = fail_without_controller(site, runs, "clm-trainer", "node2", "trainer-0")
    assert failed["node"] == "node2" and failed["process"].startswith("trainer"), failed
    assert status(site, "clm-trainer", "node3")["state"] == "failed"


def test_preflight_names_a_busy_port(site: Cluster) -> None:
    address = site.cluster_addresses()["node2"]
    site.ssh("node2", f"systemd-run --unit=clm-busy-port python3 -m http.server {JOBS_SERVER_PORT} --bind {address}")
    try:
        site.ssh("node2", f"for i in $(seq 50); do ss -ltn | grep -q ':{JOBS_SERVER_PORT} ' && exit 0; sleep 0.2; done; exit 1")
        run = site.playbook("playbooks/preflight.yml", check=False)
    finally:
        site.ssh("node2", "systemctl stop clm-busy-port")
    assert run.failed_hosts() == ["node2"], f"{run.recap}\n{run.output[-3000:]}"
    assert f"node2: port(s) {JOBS_SERVER_PORT} on {address} in use" in flat(run.output), run.output[-3000:]


def test_preflight_names_a_workspace_that_is_not_shared(site: Cluster) -> None:
    # node3 sees its own ip_config.txt: what a local directory in place of the shared mount would give.
    site.ssh("node3", f"cp {WORKSPACE}/ip_config.txt /root/ip_config.txt && echo '# local' >> /root/ip_config.txt"
                      f" && mount --bind /root/ip_config.txt {WORKSPACE}/ip_config.txt")
    try:
        run = site.playbook("playbooks/preflight.yml", check=False)
    finally:
        site.ssh("node3", f"umount {WORKSPACE}/ip_config.txt")
    assert run.failed_hosts() == ["node3"], f"{run.recap}\n{run.output[-3000:]}"
    assert (f"node3: {WORKSPACE}/ip_config.txt differs from the copy on the storage host: the workspace is not "
            "shared; run site.yml") in flat(run.output), run.output[-3000:]


def test_site_refuses_a_workspace_that_is_not_shared_before_any_change(site: Cluster) -> None:
    # dglkit_shared_fs: existing (every e2e cluster): the user's filesystem must really be shared. node3's own
    # empty directory in its place is what a forgotten mount gives.
    site.ssh("node3", f"mount -t tmpfs tmpfs {WORKSPACE}")
    try:
        run = site.playbook("site.yml", check=False)
    finally:
        site.ssh("node3", f"umount {WORKSPACE}")
    assert run.returncode != 0
    assert (f"node3 does not see the marker {WORKSPACE}/.dglkit-workspace that node1 wrote: {WORKSPACE} on node3 "
            "is not the shared filesystem") in run.flat(), run.output[-3000:]
    assert run.changed_hosts() == [], run.recap


def test_a_launcher_that_fails_its_own_preflight_is_named_with_its_line(site: Cluster, runs: Path) -> None:
    # train.yml's check (the launcher's checks in every worker's pre-flight) passes; then, before node3's launcher starts,
    # something takes its DGL server port (a drop-in of the job unit does, and lets go when the unit ends).
    address = site.cluster_addresses()["node3"]
    dropin = "/etc/systemd/system/dglkit-job.service.d/clm-squat.conf"
    site.ssh("node3", f"""mkdir -p {Path(dropin).parent} && cat > {dropin} <<'EOF'
[Service]
ExecStartPre=+systemd-run --unit=clm-squat python3 -m http.server {JOBS_SERVER_PORT} --bind {address}
ExecStartPre=+/bin/sh -c 'until ss -Hltn "sport = :{JOBS_SERVER_PORT}" | grep -q .; do sleep 0.1; done'
ExecStopPost=+systemctl stop clm-squat
EOF
systemctl daemon-reload""")
    try:
        run = train(site, runs, *JOB, *NO_RESTARTS, "-e", "dgl_job_id=clm-preflight", "-e", "dgl_job_poll_seconds=5",
                    check=False)
    finally:
        site.ssh("node3", f"rm {dropin} && systemctl daemon-reload && systemctl stop clm-squat || true")
    line = (f"dglkit launch: error: port {JOBS_SERVER_PORT} on {address} (DGL server 0) is not free: Address already in use; "
            "stop what holds it or choose another port")
    assert (runs / "clm-preflight/nodes/node3/unit.log").read_text().splitlines()[-1] == line
    assert run.returncode != 0
    assert (f"job clm-preflight failed on node3: node node3: no {WORKSPACE}/jobs/clm-preflight/nodes/node3/status.json "
            f"({line})") in run.flat(), run.output[-4000:]
    assert_clean(site)


def test_stop_reports_what_a_job_left(site: Cluster) -> None:
    # node2: a server of the last job (the test above) that escaped the job unit's stop: as the job account, in a
    # unit of its own, with the environment the launcher gives the job's processes, on the job's port.
    # node3: a DGL segment.
    job_dir = site.ssh("node2", "systemctl show -P WorkingDirectory dglkit-job").stdout.strip()
    assert job_dir.startswith(f"{WORKSPACE}/jobs/"), job_dir
    escaped = f"{JOBS_VENV}/bin/python -m http.server {JOBS_SERVER_PORT} --bind {site.cluster_addresses()['node2']}"
    site.ssh("node2", f"systemd-run --unit=clm-escaped --uid=dglkit --gid=dglkit -E DGLKIT_OUTPUT_DIR={job_dir} "
                      f"-E DGL_ROLE=server {escaped}")
    leftover = "/dev/shm/node~_N~feat-kvdata-"
    site.ssh("node3", f"head -c 4096 /dev/zero > '{leftover}'")
    # The job rewrote its job.json: a servers count root cannot use, sshd's port as its master port. The unit's
    # command says what the job was started with.
    rewrite = (f"import json; c = json.load(open('{job_dir}/job.json')); c.update(num_servers='x', master_port=22); "
               f"json.dump(c, open('{job_dir}/job.json', 'w'))")
    site.ssh("node2", f"cp -p {job_dir}/job.json /root/job.json.kept && runuser -u dglkit -- python3 -c \"{rewrite}\"")
    try:
        pid = site.ssh("node2", "systemctl show -P MainPID clm-escaped").stdout.strip()
        run = site.playbook("playbooks/stop.yml", check=False)
    finally:
        site.ssh("node2", "systemctl stop clm-escaped")
        site.ssh("node3", f"rm -f '{leftover}'")
        site.ssh("node2", f"cp -p /root/job.json.kept {job_dir}/job.json && rm /root/job.json.kept")
    assert run.failed_hosts() == ["node2", "node3"], f"{run.recap}\n{run.output[-3000:]}"
    assert "port(s) 22" not in run.flat(), run.output[-3000:]
    assert f"node2: the stopped job left processes {pid} (dglkit, clm-escaped.service: {escaped})" in run.flat(), \
        run.output[-3000:]
    assert f"node3: the stopped job left /dev/shm files {leftover}" in run.flat(), run.output[-3000:]


def test_resize_renders_ip_config_in_order_and_old_nodes_trust_the_new_one(site: Cluster, runs: Path) -> None:
    """A third worker, a GraphBolt job on the 3 parts, then back to two workers, where the first job of the module
    (its partition and its finished result) is found again."""
    site.up(4)
    try:
        # The inventory grew, site.yml has not run: preflight.yml refuses a partition count that cannot match.
        run = site.playbook("playbooks/preflight.yml", check=False)
        assert run.returncode != 0
        assert re.search(r"ip_config\.txt lists 2 machine\(s\) \(.*\) but the inventory has 3 worker\(s\) "
                         r"\(.*\), so the partition count would not match: run site.yml", flat(run.output)), \
            run.output[-3000:]
        site.stand_up()
        assert workers(site) == ["node2", "node3", "node4"]
        assert (site.workspace / "ip_config.txt").read_text().splitlines() == ip_config_of_workers(site)
        for old in ("node1", "node2", "node3"):
            for target in ("node4", site.cluster_addresses()["node4"]):
                # As the job account, whose SSH mesh it is (docs/design.md, "Who runs what").
                out = site.ssh(old, f"runuser -u dglkit -- ssh -o BatchMode=yes -o StrictHostKeyChecking=yes "
                                    f"-o UserKnownHostsFile=/dev/null {target} hostname").stdout.strip()
                assert out == "node4", (old, target, out)
        assert site.playbook("playbooks/preflight.yml").failed_hosts() == []
        run = train(site, runs, *JOB, "-e", "dgl_job_graphbolt=true")
        folder = run_folder(run.output)
        job = json.loads((folder / "job.json").read_text())
        assert folder.name.startswith("synthetic-3w-") and Path(job["part_config"]).parent.name.endswith("-3p"), job
        part_config = site.workspace / Path(job["part_config"]).relative_to(WORKSPACE)
        assert json.loads(part_config.read_text())["num_parts"] == 3
        result = json.loads((folder / "result.json").read_text())
        assert result["num_trainers"] == 3 and result["val_acc"] > 0.5, result
        assert "graphbolt       yes" in (folder / "summary.txt").read_text()
        assert sorted(p.name for p in (folder / "nodes").iterdir()) == ["node2", "node3", "node4"]
        assert_clean(site)
    finally:
        site.remove("node4")
    site.stand_up()
    assert workers(site) == ["node2", "node3"]
    assert (site.workspace / "ip_config.txt").read_text().splitlines() == ip_config_of_workers(site)
    run = train(site, runs, *SAMPLED_JOB)
    assert "finished before" in run.output and run.changed_hosts() == [], run.recap


# Features outweigh the structure: what the distributed builder spares the storage host (last in the module:
# the storage host's memory is capped while it runs).
WIDE = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_synthetic_feat_dim=2000", "-e", "dgl_job_epochs=1",
        "-e", "dgl_job_batch_size=100"]


def test_a_capped_storage_host_refuses_to_partition_alone_and_the_workers_build_the_parts(
        site: Cluster, runs: Path) -> None:
    from dglkit.resources import memory_estimate

    run = train(site, runs, *WIDE, "-e", "dgl_job_partition_builder=distributed", "-e", "dgl_job_progress_seconds=1")
    # A line a second while each worker builds its part (dglkit follow's polls), the part in it.
    assert re.search(r"^\d\d:\d\d:\d\d partition: part [01] of 2: [a-z]", run.output, re.M), run.output[-4000:]
    folder = run_folder(run.output)
    result = json.loads((folder / "result.json").read_text())
    assert result["num_trainers"] == 2 and result["val_acc"] > 0.3, result
    partition = Path(json.loads((folder / "job.json").read_text())["part_config"]).parent.name
    assert partition.endswith("-2p-distributed"), partition
    manifest = json.loads((site.workspace / "partitions" / partition / "manifest.json").read_text())
    assert manifest["complete"] and [part["host"] for part in manifest["parts"]] == workers(site), manifest
    dataset_id = partition.removesuffix("-2p-distributed")
    dataset = json.loads((site.workspace / "datasets" / dataset_id / "dataset.json").read_text())
    sizes = dataset["num_nodes"], dataset["num_edges"], dataset["feat_dim"], 2
    single, storage = memory_estimate("lean", *sizes), memory_estimate("assign", *sizes)
    # Every host of the distributed builder peaked below what the single-host builder is estimated to need.
    assert max(part["peak_rss_mb"] for part in manifest["parts"]) * 2**20 < single, manifest["parts"]

    # The storage host gets half-way between what its steps need and what the single-host builder needs.
    cap = working_set(site, "node1") + (storage + single) // 2
    site.cap_memory("node1", cap // 2**20)
    try:
        refused = train(site, runs, *WIDE, check=False)
        message = flat(refused.output)
        found = re.search(r"partitioning 20000 nodes and \d+ edges \(--builder lean\) needs about ([\d.]+) GB of "
                          r"memory; this host has ([\d.]+) GB available \(memory cgroup limit", message)
        assert refused.returncode != 0 and found, refused.output[-4000:]
        assert float(found[2]) <= float(found[1]) and "dgl_job_partition_builder: distributed" in message
        assert not (site.workspace / "partitions" / f"{dataset_id}-2p").exists(), "written before the refusal"
        # Under the same cap, the storage host's heavy step of the distributed builder runs (METIS).
        site.ssh("node1", f"runuser -u dglkit -- {JOBS_VENV}/bin/python -m dglkit partition --dataset-dir "
                          f"{WORKSPACE}/datasets/{dataset_id} --out {WORKSPACE}/partitions/capped --num-parts 2 "
                          "--builder distributed --step assign", timeout=300)
        assert (site.workspace / "partitions" / "capped" / "assignment.npy").is_file()
    finally:
        site.cap_memory("node1", 0)
        site.ssh("node1", f"rm -rf {WORKSPACE}/partitions/capped")
    assert_clean(site)

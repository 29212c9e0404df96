"""playbooks/train.yml, status.yml and stop.yml on one 3-host test cluster (node1 storage, node2 and node3
workers), stood up once with site.yml: training across hosts with GraphBolt off and on, the same job again
(changed=0), a resize to 3 workers and back, a server killed mid-training, and stop.yml on a running job.

The tests share the cluster and run in file order: each leaves every host clean for the next.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# 20k nodes, 3 epochs: about 20 steps per trainer per epoch, enough to beat chance (10 classes) clearly.
JOB = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_epochs=3", "-e", "dgl_job_batch_size=100"]
# A job that runs until a test stops it; polled every 5 s so that the playbook reacts quickly.
ENDLESS = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_epochs=1000", "-e", "dgl_job_batch_size=100",
           "-e", "dgl_job_poll_seconds=5", "-e", "dgl_job_force=true"]
# The job account's default uid: the owner of everything a job writes.
ACCOUNT_UID = 30050
# One host-side look for leftovers of a job: processes, listening DGL/rendezvous ports, /dev/shm, the unit.
LEFTOVERS = r"""
import json, os, subprocess
procs = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        cmd = open('/proc/%s/cmdline' % pid, 'rb').read().replace(b'\0', b' ').decode()
    except OSError:
        continue
    if 'dglkit' in cmd and pid != str(os.getpid()):
        procs.append(cmd[:120])
ports = set()
for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == '0A':
            ports.add(int(fields[1].rsplit(':', 1)[1], 16))
unit = subprocess.run(['systemctl', 'is-active', 'dglkit-job'], capture_output=True, text=True).stdout.strip()
print(json.dumps({'procs': procs, 'ports': sorted(ports & {29500, 30050}), 'shm': os.listdir('/dev/shm'), 'unit': unit}))
"""


@pytest.fixture(scope="module")
def site(cluster: Cluster) -> Cluster:
    cluster.stand_up()
    return cluster


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def train(cluster: Cluster, runs: Path, *args: str, check: bool = True):
    return cluster.playbook("playbooks/train.yml", "-e", f"dgl_job_run_dir={runs}", *args, check=check)


# train.yml runs started in the background by the current test.
BACKGROUND: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def stop_background_jobs(cluster: Cluster) -> Iterator[None]:
    """A test that fails while its train.yml runs must not leave that job to the next test."""
    yield
    left = [proc for proc in BACKGROUND if proc.poll() is None]
    for proc in left:
        proc.kill()
        proc.communicate()
    BACKGROUND.clear()
    if left:
        cluster.playbook("playbooks/stop.yml", check=False)


def start_train(cluster: Cluster, runs: Path, *args: str) -> subprocess.Popen:
    """train.yml in the background (stdout+stderr in one pipe)."""
    cmd = [str(BIN / "ansible-playbook"), "-i", str(cluster.inventory), "playbooks/train.yml",
           "-e", f"dgl_job_run_dir={runs}", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"})
    BACKGROUND.append(proc)
    return proc


def flat(output: str) -> str:
    """Output with the YAML callback's line wrapping undone."""
    return " ".join(output.split())


def run_folder(output: str) -> Path:
    found = re.search(r"run folder: (/[^\s']+)", flat(output))
    assert found, output[-3000:]
    return Path(found.group(1))


def workers(cluster: Cluster) -> list[str]:
    return list(cluster.groups()["workers"])


def assert_clean(cluster: Cluster) -> None:
    for host in cluster.hosts():
        script = base64.b64encode(LEFTOVERS.encode()).decode()
        left = json.loads(cluster.ssh(host, f"python3 -c 'import base64; exec(base64.b64decode(\"{script}\"))'").stdout)
        assert left == {"procs": [], "ports": [], "shm": [], "unit": "inactive"}, (host, left)


def wait_for_epoch(cluster: Cluster, job_id: str, node: str, timeout: float = 600) -> dict:
    """The node's status.json once the job's rank 0 has logged an epoch."""
    job_dir = cluster.workspace / "jobs" / job_id
    deadline = time.time() + timeout
    while time.time() < deadline:
        metrics = job_dir / "metrics.jsonl"
        if metrics.exists() and '"event": "epoch"' in metrics.read_text():
            return json.loads((job_dir / "nodes" / node / "status.json").read_text())
        time.sleep(1)
    pytest.fail(f"job {job_id} logged no epoch within {timeout:.0f} s")


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"train.yml did not end within {timeout:.0f} s:\n{output[-4000:]}")
    return output


def test_train_across_hosts(site: Cluster, runs: Path) -> None:
    run = train(site, runs, *JOB)
    # Progress lines while it runs, the last one when it is done.
    assert re.search(r"running[^\]]*\[node2 running, node3 running\]", flat(run.output)), run.output[-4000:]
    assert re.search(r"succeeded: epoch 3/3 [^\]]*\[node2 succeeded, node3 succeeded\]", flat(run.output))
    folder = run_folder(run.output)
    result = json.loads((folder / "result.json").read_text())
    assert result["num_trainers"] == 2 and result["val_acc"] > 0.5, result  # chance: 0.1
    epochs = [m for m in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if m["event"] == "epoch"]
    assert [m["epoch"] for m in epochs] == [0, 1, 2]
    assert {"job.json", "metrics.jsonl", "result.json", "summary.json", "summary.txt", "curves.png"} <= \
        {p.name for p in folder.iterdir()}
    assert not (folder / "embeddings.npy").exists() and not (folder / "FAILED").exists()
    for node, rank in (("node2", 0), ("node3", 1)):
        status = json.loads((folder / "nodes" / node / "status.json").read_text())
        assert status["state"] == "succeeded", status
        for log in ("launcher.log", "server-0.log", f"trainer-{rank}.log"):
            assert (folder / "nodes" / node / log).stat().st_size > 0, (node, log)
        assert (folder / "nodes" / node / "torchrun.log").exists()
    assert "graphbolt       no" in (folder / "summary.txt").read_text()
    # prepare, partition, the launchers and report ran as the job account: it owns all the job data.
    data = [p for top in ("datasets", "partitions", "jobs") for p in (site.workspace / top).rglob("*")]
    assert data and {p: p.stat().st_uid for p in data if p.stat().st_uid != ACCOUNT_UID} == {}
    assert_clean(site)


def test_partition_graph_partition_trains_as_the_lean_one(site: Cluster, runs: Path) -> None:
    """The same job on dgl.distributed.partition_graph's partition of the same graph: its own partition id,
    METIS cuts alike, and the model reaches the accuracy it reaches on the lean partition (the default)."""
    lean = json.loads((run_folder(train(site, runs, *JOB).output) / "result.json").read_text())
    run = train(site, runs, *JOB, "-e", "dgl_job_partition_builder=dgl")
    folder = run_folder(run.output)
    partition = Path(json.loads((folder / "job.json").read_text())["part_config"]).parent
    assert partition.name.endswith("-2p-dgl")
    manifests = [json.loads((site.workspace / "partitions" / name / "manifest.json").read_text())
                 for name in (partition.name, partition.name[:-len("-dgl")])]
    assert [m["parameters"]["builder"] for m in manifests] == ["dgl", "lean"]
    cuts = [m["edge_cut"]["fraction"] for m in manifests]
    assert abs(cuts[0] - cuts[1]) <= 0.1 * cuts[0], cuts
    standard = json.loads((folder / "result.json").read_text())
    for key in ("val_acc", "test_acc"):
        assert abs(standard[key] - lean[key]) < 0.05, (key, standard, lean)
    assert_clean(site)


def test_the_same_job_again_changes_nothing(site: Cluster, runs: Path) -> None:
    run = train(site, runs, *JOB)
    assert "finished before" in run.output
    assert run.changed_hosts() == [], run.recap


def test_status_shows_the_finished_job(site: Cluster) -> None:
    run = site.playbook("playbooks/status.yml")
    assert run.output.count("no job running") == 2, run.output[-3000:]
    assert re.search(r"succeeded: epoch 3/3 [^\]]*\[node2 succeeded, node3 succeeded\]", flat(run.output))
    assert run.changed_hosts() == []


def test_resize_to_three_workers_with_graphbolt(site: Cluster, runs: Path) -> None:
    site.up(4)
    site.playbook("site.yml")
    assert len((site.workspace / "ip_config.txt").read_text().split("\n")) - 1 == 3
    run = train(site, runs, *JOB, "-e", "dgl_job_graphbolt=true")
    folder = run_folder(run.output)
    assert folder.name.startswith("synthetic-3w-")
    job = json.loads((folder / "job.json").read_text())
    partition = Path(job["part_config"])
    assert partition.parent.name.endswith("-3p")
    assert json.loads((site.workspace / "partitions" / partition.parent.name / partition.name).read_text())[
        "num_parts"] == 3
    result = json.loads((folder / "result.json").read_text())
    assert result["num_trainers"] == 3 and result["val_acc"] > 0.5, result
    assert "graphbolt       yes" in (folder / "summary.txt").read_text()
    assert sorted(p.name for p in (folder / "nodes").iterdir()) == ["node2", "node3", "node4"]
    assert_clean(site)


def test_shrink_back_to_two_workers(site: Cluster, runs: Path) -> None:
    site.remove("node4")
    site.playbook("site.yml")
    assert len((site.workspace / "ip_config.txt").read_text().split("\n")) - 1 == 2
    # The 2-worker job of the first test: its partition and finished result are found again.
    run = train(site, runs, *JOB)
    assert "finished before" in run.output and run.changed_hosts() == [], run.recap


def test_a_killed_server_fails_the_job_naming_its_host(site: Cluster, runs: Path) -> None:
    proc = start_train(site, runs, *ENDLESS, "-e", "dgl_job_id=e2e-fault")
    status = wait_for_epoch(site, "e2e-fault", "node3")
    server = next(p["pid"] for p in status["processes"] if p["name"] == "server-0")
    site.ssh("node3", f"kill -9 {server}")
    killed = time.time()
    output = finish(proc, timeout=240)
    assert proc.returncode != 0
    assert "job e2e-fault failed on node3: server-0: exited with signal SIGKILL" in flat(output), output[-4000:]
    # Detection, the stop of every node, the leftover checks and fetching the logs, under a loaded machine.
    assert time.time() - killed < 180
    assert json.loads((runs / "e2e-fault" / "FAILED").read_text())["node"] == "node3"
    assert_clean(site)


def test_stop_stops_a_running_job_everywhere(site: Cluster, runs: Path) -> None:
    # With limits, which the test hosts accept but do not enforce (no delegated memory controller).
    proc = start_train(site, runs, *ENDLESS, "-e", "dgl_job_id=e2e-stop", "-e", "dgl_job_memory_max=6G",
                       "-e", "dgl_job_cpu_quota=150%")
    wait_for_epoch(site, "e2e-stop", "node2")
    for host in workers(site):
        # Every process of the job's unit (launcher, servers, torchrun, trainers) runs as the job account.
        listing = site.ssh(host, "ps -e -o unit=,user=,args=").stdout.splitlines()
        job = [line.split(None, 2) for line in listing if line.startswith("dglkit-job.service ")]
        assert len(job) >= 4 and {user for _, user, _ in job} == {"dglkit"}, (host, job)
        # In the unit's sandbox even the account's own datasets are read-only; only the job directory is not.
        attempt = ("nsenter --target $(systemctl show -P MainPID dglkit-job) --mount --setuid {0} --setgid {0} "
                   "touch {1}/x").format(ACCOUNT_UID, "/srv/dglkit/datasets")
        denied = site.ssh(host, attempt, check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, (host, denied.stderr)
        site.ssh(host, attempt.replace("/srv/dglkit/datasets", "/srv/dglkit/jobs/e2e-stop") + " && rm /srv/dglkit/jobs/e2e-stop/x")
    status = site.playbook("playbooks/status.yml")
    assert flat(status.output).count("dglkit job e2e-stop: active") == 2, status.output[-3000:]
    stop = site.playbook("playbooks/stop.yml")
    assert stop.changed_hosts() == workers(site), stop.recap
    output = finish(proc, timeout=180)
    assert proc.returncode != 0 and "job e2e-stop failed on" in flat(output) and "SIGTERM" in output, output[-4000:]
    assert_clean(site)
    assert site.playbook("playbooks/stop.yml").changed_hosts() == []

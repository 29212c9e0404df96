"""playbooks/train.yml, status.yml and stop.yml on the training cluster (node1 storage, node2 and node3
workers; conftest.train_cluster: stood up once with site.yml, firewall on, node3's cluster address given as a
host name; test_builtin_tasks and test_own_programs use it first): training across hosts, the same job again
(changed=0), two site.yml at once (the second refused by the first's lock), a train.yml while another starter
holds the job lock, ip_config.txt with a line that is no worker's, a job needing ports the firewall keeps
closed, a trainer killed while the controller is away (restart from the checkpoint, then a new train.yml
attaches), a server killed with no restarts (fails fast), an outsider on the cluster network probing a running
job and stop.yml during a restart, a worker host that shuts down and boots again mid-job (the job restarts with
it), stop.yml while the job waits for a host that is down, and a worker host that goes down for good.
test_jobs.py resizes its cluster.

The tests share the cluster and run in file order: each leaves every host clean for the next.
"""
from __future__ import annotations

import base64
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobhelpers import assert_clean, flat, kill, run_folder, start_train, stop_background, train, workers

if TYPE_CHECKING:
    from conftest import Cluster


# 20k nodes, 3 epochs: about 20 steps per trainer per epoch, enough to beat chance (10 classes) clearly.
JOB = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_epochs=3", "-e", "dgl_job_batch_size=100"]
# A job that runs until a test stops it; polled every 5 s so that the playbook reacts quickly.
ENDLESS = ["-e", "dgl_job_synthetic_nodes=20000", "-e", "dgl_job_epochs=1000", "-e", "dgl_job_batch_size=100",
           "-e", "dgl_job_poll_seconds=5", "-e", "dgl_job_force=true"]
# The job account's default uid: the owner of everything a job writes.
ACCOUNT_UID = 30050
# Tries TCP connections to "ip:port" arguments at once; prints {"ip:port": "open" | "refused" | "timeout"}.
PROBE = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    ip, port = target.rsplit(':', 1)
    try:
        socket.create_connection((ip, int(port)), timeout=5).close()
        return 'open'
    except ConnectionRefusedError:
        return 'refused'
    except OSError:
        return 'timeout'
with ThreadPoolExecutor(32) as pool:
    print(json.dumps(dict(zip(sys.argv[1:], pool.map(probe, sys.argv[1:])))))
"""


# The training cluster and its run folder, shared with test_builtin_tasks and test_own_programs (conftest).
@pytest.fixture(scope="module")
def site(train_cluster: Cluster) -> Cluster:
    return train_cluster


@pytest.fixture(scope="module")
def runs(train_runs: Path) -> Path:
    return train_runs


@pytest.fixture(autouse=True)
def stop_background_jobs(site: Cluster) -> Iterator[None]:
    yield
    stop_background(site)


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
        output = kill(proc)
        pytest.fail(f"train.yml did not end within {timeout:.0f} s:\n{output[-4000:]}")
    return output


def test_train_across_hosts(site: Cluster, runs: Path) -> None:
    assert (site.workspace / "ip_config.txt").read_text().split("\n")[1] == f"{site.hosts()['node3']} 30050"
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
    # The curves in TensorBoard from a clone (ansible.cfg's action_plugins): one event file (test_collection.py and
    # unit/test_tboard.py check what it holds).
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    for node, rank in (("node2", 0), ("node3", 1)):
        status = json.loads((folder / "nodes" / node / "status.json").read_text())
        assert status["state"] == "succeeded", status
        for log in ("launcher.log", "server-0.log", f"trainer-{rank}.log"):
            assert (folder / "nodes" / node / log).stat().st_size > 0, (node, log)
    assert "graphbolt       no" in (folder / "summary.txt").read_text()
    # prepare, partition, the launchers and report ran as the job account: it owns all the job data.
    data = [p for top in ("datasets", "partitions", "jobs") for p in (site.workspace / top).rglob("*")]
    assert data and {p: p.stat().st_uid for p in data if p.stat().st_uid != ACCOUNT_UID} == {}
    assert_clean(site)


def test_partition_graph_partition_trains_as_the_lean_one(site: Cluster, runs: Path) -> None:
    """The same job on dgl.distributed.partition_graph's partition of the same graph: its own partition id,
    METIS cuts alike, and the model reaches the accuracy it reaches on the lean partition (the default)."""
    lean = json.loads((run_folder(train(site, runs, *JOB).output) / "result.json").read_text())
    run = train(site, runs, *JOB, "-e", "dgl_job_partition_builder=dgl", "-e", "dgl_job_progress_seconds=1")
    # A line a second while the storage host partitions (dglkit follow's polls), timed as the job's own lines.
    assert re.search(r"^\d\d:\d\d:\d\d partition: [a-z]", run.output, re.M), run.output[-4000:]
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


def test_a_second_site_run_is_refused_while_the_first_holds_the_lock(site: Cluster) -> None:
    lock = "/run/dglkit/site.lock"
    first = site.start_playbook("site.yml")
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.append(first.stdout.read()))
    reader.start()
    try:
        # The first run past its checks, inside the lock: held there (stopped) while the second one runs.
        while site.ssh("node1", f"test -d {lock}", check=False).returncode != 0:
            assert first.poll() is None, "the first site.yml ended without taking the lock"
            time.sleep(0.5)
        os.killpg(first.pid, signal.SIGSTOP)
        try:
            second = site.playbook("site.yml", check=False)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        first.wait(timeout=1200)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        reader.join()
    assert first.returncode == 0, output[0][-3000:]
    user = os.environ.get("SUDO_USER") or pwd.getpwuid(os.getuid()).pw_name
    assert (f"another site.yml is setting up this cluster ({user} on {socket.gethostname()} running site.yml since "
            in second.flat()), second.output[-3000:]
    assert f"(if that playbook is gone, remove {lock} on node1)" in second.flat()
    assert second.returncode != 0 and second.changed_hosts() == [], second.recap
    assert site.ssh("node1", f"test -e {lock}", check=False).returncode != 0  # the first released it


def test_a_train_run_is_refused_while_another_starter_holds_its_lock(site: Cluster, runs: Path) -> None:
    # What a train.yml leaves from its pre-flight until its launchers run: the lock with its owner line.
    lock = site.workspace / "jobs" / ".start.lock"
    lock.mkdir()
    (lock / "owner").write_text("ann on ctl starting job-x since 2026-12-05 10:00:00 UTC\n")
    try:
        run = train(site, runs, *JOB, check=False)
        assert run.returncode != 0 and run.changed_hosts() == [], run.recap
        assert ("node1: another train.yml is starting a job on this cluster (ann on ctl starting job-x since 2026-12-05 "
                "10:00:00 UTC): wait for it to start its job and run again (if that playbook is gone, remove "
                "/srv/dglkit/jobs/.start.lock on node1)") in flat(run.output), run.output[-3000:]
        assert (lock / "owner").is_file()  # a refused run leaves the holder's lock alone
    finally:
        shutil.rmtree(lock)
    # The pre-flight alone looks without taking it.
    site.playbook("playbooks/preflight.yml", check=False)
    assert not lock.exists()


def test_an_ip_config_line_that_is_no_workers_is_named(site: Cluster) -> None:
    # Two lines for two workers, one of them an address no worker has (what a host that changed its address
    # without site.yml leaves): the counts agree, the reason is the address.
    ip_config = site.workspace / "ip_config.txt"
    original, stat = ip_config.read_text(), ip_config.stat()
    lines = original.splitlines()
    foreign = "10.77.254.254 30050"
    ip_config.write_text(f"{lines[0]}\n{foreign}\n")
    try:
        run = site.playbook("playbooks/preflight.yml", check=False)
    finally:
        ip_config.write_text(original)
        os.utime(ip_config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert run.returncode != 0
    assert (f"ip_config.txt lists 2 machine(s) ({lines[0]}, {foreign}) but the inventory has 2 worker(s) "
            f"({lines[0]}, {lines[1]}), so {foreign} is not in the inventory (an address or dglkit_server_port changed "
            "since site.yml rendered the file) and the job would connect to machines that are not its workers: run "
            "site.yml to re-render it") in flat(run.output), run.output[-3000:]


def test_a_job_needing_ports_the_firewall_keeps_closed_is_refused(site: Cluster, runs: Path) -> None:
    run = train(site, runs, *JOB, "-e", "dgl_job_servers=2", check=False)
    assert run.returncode != 0
    assert ("node2: the firewall opens DGL server ports 30050-30050 and master port 29500 to the cluster, but this "
            "job needs 30050-30051 and 29500: set dgl_job_servers") in flat(run.output), run.output[-3000:]
    assert run.changed_hosts() == [], run.recap


def test_a_killed_trainer_restarts_while_the_controller_is_away(site: Cluster, runs: Path) -> None:
    # Long enough that the trainer is killed mid-job while the other test worker loads the machine.
    epochs = 50
    job = [*JOB[:2], "-e", f"dgl_job_epochs={epochs}", *JOB[4:], "-e", "dgl_job_id=e2e-restart",
           "-e", "dgl_job_poll_seconds=5"]
    proc = start_train(site, runs, *job)
    wait_for_epoch(site, "e2e-restart", "node3")
    # Ctrl-C: the playbook ends promptly, says how to come back, and the job runs on.
    proc.send_signal(signal.SIGINT)
    interrupted = time.time()
    output = finish(proc, timeout=60)
    print(f"train.yml ended {time.time() - interrupted:.1f} s after SIGINT")
    assert "Run train.yml again with the same settings to attach" in flat(output), output[-3000:]
    assert site.ssh("node2", "systemctl is-active dglkit-job").stdout.strip() == "active"
    # A trainer dies after a checkpoint: the launchers restart the job from it, with no controller.
    job_dir = site.workspace / "jobs" / "e2e-restart"
    deadline = time.time() + 120
    while not (job_dir / "checkpoint.pt").exists():
        assert time.time() < deadline, "no checkpoint within 120 s"
        time.sleep(0.5)
    status = json.loads((job_dir / "nodes/node3/status.json").read_text())
    trainer = next(p["pid"] for p in status["processes"] if p["name"] == "trainer-1")
    site.ssh("node3", f"kill -9 {trainer}")
    # A new controller attaches to the running job and waits for it.
    run = train(site, runs, *job)
    assert "is running already: attaching" in run.output, run.output[-3000:]
    folder = run_folder(run.output)
    failed = json.loads((folder / "attempts/1/FAILED").read_text())
    assert failed["node"] == "node3" and failed["process"].startswith("trainer"), failed
    for node in ("node2", "node3"):
        assert (folder / "attempts/1/nodes" / node / "launcher.log").stat().st_size > 0
        assert json.loads((folder / "nodes" / node / "status.json").read_text())["attempt"] == 2
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics if m["event"] == "epoch"] == list(range(epochs))
    assert any(m["event"] == "resume" for m in metrics)
    # In line with the uninterrupted 3-epoch job of the first test (val_acc > 0.5 there).
    result = json.loads((folder / "result.json").read_text())
    assert result["val_acc"] > 0.5 and result["test_acc"] > 0.5, result
    assert "restart         attempt 1 failed on node3" in (folder / "summary.txt").read_text()
    assert_clean(site)


def test_a_killed_server_fails_the_job_naming_its_host(site: Cluster, runs: Path) -> None:
    # No restarts: the first failure ends the job on every node within seconds, as without the restart logic.
    proc = start_train(site, runs, *ENDLESS, "-e", "dgl_job_id=e2e-fault", "-e", "dgl_job_max_restarts=0")
    status = wait_for_epoch(site, "e2e-fault", "node3")
    server = next(p["pid"] for p in status["processes"] if p["name"] == "server-0")
    site.ssh("node3", f"kill -9 {server}")
    killed = time.time()
    output = finish(proc, timeout=240)
    assert proc.returncode != 0
    assert "job e2e-fault failed on node3: server-0: exited with signal SIGKILL" in flat(output), output[-4000:]
    # Detection, the stop of every node, the leftover checks and fetching the logs, under a loaded machine.
    assert time.time() - killed < 180
    failed = json.loads((runs / "e2e-fault" / "FAILED").read_text())
    assert failed["node"] == "node3" and failed["log_tail"], failed
    # The message ends with the end of the failed process's log, as FAILED records it.
    assert f"end of server-0.log: {' '.join(flat(line) for line in failed['log_tail'])}" in flat(output), \
        output[-4000:]
    assert_clean(site)
    # Run again and stop it: the run folder holds this run's files and the first run's under history/1/ (without
    # its checkpoint), never a file of the first run beside this run's (its FAILED, its processes' failure records).
    proc = start_train(site, runs, *ENDLESS, "-e", "dgl_job_id=e2e-fault", "-e", "dgl_job_max_restarts=0")
    job_dir = site.workspace / "jobs" / "e2e-fault"
    deadline = time.time() + 300
    while not (job_dir / "history/1").is_dir():
        assert time.time() < deadline and proc.poll() is None, "the first run was not moved to history/1/"
        time.sleep(1)
    wait_for_epoch(site, "e2e-fault", "node3")
    site.playbook("playbooks/stop.yml")
    # Stopped, or failed when a trainer lost its peer before its launcher saw STOP: the run folder is the same.
    output = finish(proc, timeout=240)
    assert "kept whole" not in flat(output), output[-4000:]
    folder = runs / "e2e-fault"
    fetched = {str(path.relative_to(folder)): path for path in folder.rglob("*") if path.is_file()}
    # The controller's own TensorBoard curves stay beside them: this run's, and the first run's under history/1/.
    curves = sorted(name for name in fetched if Path(name).name.startswith("events.out.tfevents."))
    assert [Path(name).parent.as_posix() for name in curves] == [".", "history/1"], curves
    assert not [name for name, path in fetched.items() if name not in curves
                and (not (job_dir / name).is_file() or (job_dir / name).read_bytes() != path.read_bytes())]
    assert json.loads((folder / "history/1/FAILED").read_text())["node"] == "node3"
    assert (job_dir / "history/1/checkpoint.pt").is_file() and "history/1/checkpoint.pt" not in fetched
    assert sorted(path.name for path in runs.iterdir() if path.name.startswith("e2e-fault")) == ["e2e-fault"]
    assert_clean(site)


def listening(cluster: Cluster, host: str) -> list[str]:
    """ip:port of every TCP port the host listens on for the job (sshd's aside), on its cluster address."""
    out = cluster.ssh(host, "ss -tlnH").stdout
    ports = sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines()} - {22})
    return [f"{cluster.hosts()[host]}:{port}" for port in ports]


def probe(run: Callable[[str], subprocess.CompletedProcess], targets: list[str]) -> dict[str, str]:
    script = base64.b64encode(PROBE.encode()).decode()
    proc = run(f"python3 -c 'import base64; exec(base64.b64decode(\"{script}\"))' {' '.join(targets)}")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_an_outsider_reaches_no_port_of_a_running_job_and_stop_during_a_restart_stops_everything(site: Cluster,
                                                                                                  runs: Path) -> None:
    # With limits, which the test hosts accept but do not enforce (no delegated memory controller).
    proc = start_train(site, runs, *ENDLESS, "-e", "dgl_job_id=e2e-stop", "-e", "dgl_job_memory_max=6G",
                       "-e", "dgl_job_cpu_quota=150%")
    wait_for_epoch(site, "e2e-stop", "node2")
    # DGL servers, torch's rendezvous store (node2), trainers' and gloo's ports: open to the storage host, which
    # is in the cluster, and dropped for an address on the same network that is in no inventory.
    targets = listening(site, "node2") + listening(site, "node3")
    ports = {target.rsplit(":", 1)[1] for target in targets}
    assert {"30050", "29500"} <= ports and len(ports) >= 4, targets
    assert probe(lambda cmd: site.ssh("node1", cmd, check=False), targets) == {t: "open" for t in targets}
    assert probe(site.outsider, targets) == {t: "timeout" for t in targets}
    ssh = [f"{address}:22" for address in site.hosts().values()]
    assert probe(site.outsider, ssh) == {t: "open" for t in ssh}
    for host in workers(site):
        # Every process of the job's unit (launcher, servers, trainers) runs as the job account.
        listing = site.ssh(host, "ps -e -o unit=,user=,args=").stdout.splitlines()
        job = [line.split(None, 2) for line in listing if line.startswith("dglkit-job.service ")]
        assert len(job) >= 3 and {user for _, user, _ in job} == {"dglkit"}, (host, job)
        # In the unit's sandbox even the account's own datasets are read-only; only the job directory is not.
        attempt = ("nsenter --target $(systemctl show -P MainPID dglkit-job) --mount --setuid {0} --setgid {0} "
                   "touch {1}/x").format(ACCOUNT_UID, "/srv/dglkit/datasets")
        denied = site.ssh(host, attempt, check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, (host, denied.stderr)
        site.ssh(host, attempt.replace("/srv/dglkit/datasets", "/srv/dglkit/jobs/e2e-stop")
                 + " && rm /srv/dglkit/jobs/e2e-stop/x")
    status_run = site.playbook("playbooks/status.yml")
    assert flat(status_run.output).count("dglkit job e2e-stop: active") == 2, status_run.output[-3000:]
    status = wait_for_epoch(site, "e2e-stop", "node3")
    server = next(p["pid"] for p in status["processes"] if p["name"] == "server-0")
    site.ssh("node3", f"kill -9 {server}")
    # Stop once the launchers are on their second attempt, before it trains.
    job_dir = site.workspace / "jobs" / "e2e-stop"
    deadline = time.time() + 120
    while json.loads((job_dir / "nodes/node2/status.json").read_text()).get("attempt") != 2:
        assert time.time() < deadline, "no second attempt within 120 s"
        time.sleep(0.2)
    stop = site.playbook("playbooks/stop.yml")
    assert stop.changed_hosts() == workers(site), stop.recap
    output = finish(proc, timeout=180)
    assert proc.returncode != 0 and "job e2e-stop was stopped on request" in flat(output), output[-4000:]
    assert_clean(site)
    assert site.playbook("playbooks/stop.yml").changed_hosts() == []


def wait_for_state(cluster: Cluster, job_id: str, node: str, state: str, timeout: float = 120) -> None:
    status = cluster.workspace / "jobs" / job_id / "nodes" / node / "status.json"
    deadline = time.time() + timeout
    while json.loads(status.read_text()).get("state") != state:
        assert time.time() < deadline, f"{node} not {state} within {timeout:.0f} s: {status.read_text()}"
        time.sleep(0.5)


def test_a_worker_host_that_goes_down_and_comes_back_rejoins_the_job(site: Cluster, runs: Path) -> None:
    job = [*JOB[:2], "-e", "dgl_job_epochs=12", *JOB[4:], "-e", "dgl_job_id=e2e-reboot", "-e", "dgl_job_poll_seconds=5",
           "-e", "dgl_job_max_restarts=1", "-e", "dgl_job_restart_wait=240"]
    proc = start_train(site, runs, *job)
    job_dir = site.workspace / "jobs" / "e2e-reboot"
    wait_for_epoch(site, "e2e-reboot", "node3")
    deadline = time.time() + 120
    while not (job_dir / "checkpoint.pt").exists():
        assert time.time() < deadline, "no checkpoint within 120 s"
        time.sleep(0.5)
    assert site.ssh("node3", "systemctl is-enabled dglkit-job").stdout.strip() == "enabled"
    # The host shuts down (its launcher fails the attempt), is gone for a while, and boots with its disk.
    site.shutdown("node3")
    down = time.time()
    wait_for_state(site, "e2e-reboot", "node2", "restarting")
    time.sleep(5)
    assert json.loads((job_dir / "nodes/node2/status.json").read_text())["state"] == "restarting"
    site.boot("node3")
    print(f"node3 was down {time.time() - down:.0f} s")
    output = finish(proc, timeout=400)
    assert proc.returncode == 0, output[-4000:]
    folder = run_folder(output)
    failed = json.loads((folder / "attempts/1/FAILED").read_text())
    assert failed["node"] == "node3" and "host shutting down" in failed["reason"], failed
    for node in ("node2", "node3"):
        assert (folder / "attempts/1/nodes" / node / "launcher.log").stat().st_size > 0
        status = json.loads((folder / "nodes" / node / "status.json").read_text())
        assert status["attempt"] == 2 and status["state"] == "succeeded", status
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics if m["event"] == "epoch"] == list(range(12))
    resumed = [m for m in metrics if m["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["epoch"] >= 1, resumed
    assert "restart         attempt 1 failed on node3" in (folder / "summary.txt").read_text()
    # Done: no launcher starts at the next boot.
    assert {site.ssh(h, "systemctl is-enabled dglkit-job", check=False).stdout.strip() for h in workers(site)} == \
        {"disabled"}
    assert_clean(site)


def test_stop_while_the_job_waits_for_a_host_to_come_back_stops_everything(site: Cluster, runs: Path) -> None:
    proc = start_train(site, runs, *ENDLESS, "-e", "dgl_job_id=e2e-stop-down", "-e", "dgl_job_max_restarts=1",
                       "-e", "dgl_job_restart_wait=600")
    wait_for_epoch(site, "e2e-stop-down", "node3")
    site.shutdown("node3")
    wait_for_state(site, "e2e-stop-down", "node2", "restarting")
    stop = site.playbook("playbooks/stop.yml", check=False)
    # The worker that is up is stopped; the one that is down is named, and the run fails (exit 2), not with
    # Ansible's exit 4 for an unreachable host.
    assert stop.returncode == 2 and stop.recap["node2"]["changed"] > 0, stop.output[-3000:]
    assert "could not reach node3: the job was not stopped or checked there" in flat(stop.output), stop.output[-3000:]
    assert "stopped and checked on node2" in flat(stop.output), stop.output[-3000:]
    status = site.playbook("playbooks/status.yml")
    assert "could not reach node3: its job unit is not shown" in flat(status.output), status.output[-3000:]
    output = finish(proc, timeout=180)
    assert proc.returncode != 0 and "job e2e-stop-down was stopped on request" in flat(output), output[-4000:]
    # The host that was down when the job stopped boots, its unit still enabled, and starts nothing of the job
    # (a launcher that started would refuse the STOP file in unit.log).
    unit_log = site.workspace / "jobs/e2e-stop-down/nodes/node3/unit.log"
    logged = unit_log.read_text()
    site.boot("node3")
    assert site.ssh("node3", "systemctl is-enabled dglkit-job").stdout.strip() == "enabled"
    time.sleep(5)
    assert unit_log.read_text() == logged
    assert_clean(site)
    assert site.playbook("playbooks/stop.yml").changed_hosts() == ["node3"]


def test_a_worker_host_that_stays_down_fails_the_job_naming_it(site: Cluster, runs: Path) -> None:
    """The host shuts down and is not back within the restart wait: the job fails at that barrier, naming it, with
    a restart still left; when the host boots after that, its launcher starts nothing and the unit disables itself."""
    proc = start_train(site, runs, *ENDLESS, "-e", "dgl_job_id=e2e-down", "-e", "dgl_job_max_restarts=2",
                       "-e", "dgl_job_stale_after=15", "-e", "dgl_job_restart_wait=15")
    wait_for_epoch(site, "e2e-down", "node3")
    site.shutdown("node3")
    gone = time.time()
    output = finish(proc, timeout=300)
    print(f"train.yml ended {time.time() - gone:.0f} s after node3 went down")
    assert proc.returncode != 0, output[-4000:]
    # Attempt 2 never started and was the last: the report counts the attempts that ran.
    assert re.search(r"job e2e-down failed on node3: node: node\(s\) node3 did not come back within 15 s; 1 attempt ran "
                     r"\(at most 3\); attempt 2 did not start", flat(output)), output[-4000:]
    assert "attempt 3" not in flat(output)
    job_dir = site.workspace / "jobs" / "e2e-down"
    assert not (job_dir / "attempts/2").exists()
    # train.yml could not disable node3's unit: at boot its launcher finds the job over and the unit disables itself.
    site.boot("node3")
    deadline = time.time() + 120
    while site.ssh("node3", "systemctl is-enabled dglkit-job", check=False).stdout.strip() != "disabled":
        assert time.time() < deadline, (job_dir / "nodes/node3/unit.log").read_text()[-3000:]
        time.sleep(1)
    unit_log = (job_dir / "nodes/node3/unit.log").read_text()
    assert "the job failed on node node3 (a node it needs is gone): nothing to do on node3" in unit_log, unit_log
    assert_clean(site)

"""`dglkit control` (roles/dgl_job_control): the unit's state, what a stopped job left (real processes, sockets and
files), STOP as the job account, and the job status.yml reports on. systemctl itself needs a host with systemd:
the e2e tier runs the whole command (test_train.py, test_jobs.py)."""

import argparse
import json
import os
import pwd
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dglkit import mpiunit
from dglkit.common import UserError
from dglkit.control import (
    as_account,
    describe,
    file_record,
    job_dirs,
    job_processes,
    leftovers,
    listening,
    parse_show,
    pick_job,
    request_stop,
    shm_segments,
    still_listening,
    stop,
)
from dglkit.mpicomm import PROGRESS_ENV
from localjob import free_ports

SHOW = "LoadState={}\nActiveState={}\nUnitFileState=enabled\nWorkingDirectory=/srv/dglkit/jobs/j1\nDescription=dglkit job j1\n"


@pytest.mark.parametrize("load, active, running", [("loaded", "active", True), ("loaded", "activating", True),
                                                   ("loaded", "deactivating", True), ("loaded", "inactive", False),
                                                   ("loaded", "failed", False), ("not-found", "inactive", False)])
def test_the_unit_runs_a_job_unless_inactive_or_failed(load: str, active: str, running: bool) -> None:
    unit = describe(parse_show(SHOW.format(load, active)), "node2")
    assert unit["running"] is running and unit["loaded"] is (load == "loaded") and unit["enabled"] is True
    assert unit["job_dir"] == "/srv/dglkit/jobs/j1"
    assert unit["line"] == (f"node2: dglkit job j1: {active}" if running else "node2: no job running")


@pytest.fixture
def sleepers(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen]]:
    """A process of the job by its environment, the launcher by its command line, and an outsider."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    procs = {"by environment": subprocess.Popen(sleep, env={**os.environ, "DGLKIT_OUTPUT_DIR": str(job_dir)}),
             "by command": subprocess.Popen([*sleep, "--config", f"{job_dir}/job.json"]),
             "outsider": subprocess.Popen([*sleep, f"{job_dir}/other.json"])}
    yield procs
    for proc in procs.values():
        proc.kill()
        proc.wait()


def test_the_job_processes_are_found_by_environment_and_command_line(sleepers: dict, tmp_path: Path) -> None:
    found = {int(line.split()[0]): line for line in job_processes(str(tmp_path / "job"))}
    assert sleepers["by environment"].pid in found and sleepers["by command"].pid in found
    assert sleepers["outsider"].pid not in found
    user = pwd.getpwuid(os.getuid()).pw_name
    assert found[sleepers["by command"].pid].startswith(f"{sleepers['by command'].pid} ({user}, "), found


def test_dgl_segments_are_regular_files_named_after_the_graph_or_the_kvstore(tmp_path: Path) -> None:
    for name in ("node~_N~feat-kvdata-", "edge~_E~w-kvdata-", "mygraph-indptr", "unrelated", ".node~hidden"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "node~link").symlink_to(tmp_path / "unrelated")
    (tmp_path / "edge~dir").mkdir()
    found = [Path(path).name for path in shm_segments("mygraph", tmp_path)]
    assert found == ["edge~_E~w-kvdata-", "mygraph-indptr", "node~_N~feat-kvdata-"]
    assert [Path(path).name for path in shm_segments("", tmp_path)] == ["edge~_E~w-kvdata-", "node~_N~feat-kvdata-"]


def test_a_listening_port_is_seen_until_it_closes() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        # A connection's own port is in use, but nothing serves there.
        with socket.create_connection(("127.0.0.1", port)) as client:
            assert listening([client.getsockname()[1], port]) == [port]
    assert listening([port]) == []


def test_leftovers_name_processes_segments_and_ports(sleepers: dict, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "node~_N~feat-kvdata-").write_bytes(b"x")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        config = {"num_servers": 1, "master_port": 1, "part_config": "/srv/dglkit/partitions/p/mygraph.json"}
        args = argparse.Namespace(server_port=port, servers=4, master_port=2, graph="", ports_wait=0.5)
        left = leftovers(str(tmp_path / "job"), config, args, shm)
    assert len(left) == 3 and left[0].startswith("processes ") and str(sleepers["by environment"].pid) in left[0]
    assert left[1:] == [f"/dev/shm files {shm}/node~_N~feat-kvdata-", f"port(s) {port} listening"]
    for proc in sleepers.values():
        proc.kill()
        proc.wait()
    (shm / "node~_N~feat-kvdata-").unlink()
    assert leftovers(str(tmp_path / "job"), config, args, shm) == []


def unit_show(job_dir: Path, flags: str) -> str:
    """`systemctl show` of a job unit that is over, whose command carries flags (as systemd prints ExecStart)."""
    argv = (f'/bin/sh -c exec "$0" "$@" >>"$DGLKIT_UNIT_LOG" 2>&1 /srv/dglkit/venv/bin/python -m dglkit launch '
            f"--config {job_dir}/job.json {flags} --node-name node2")
    return (f"LoadState=loaded\nActiveState=inactive\nUnitFileState=disabled\nWorkingDirectory={job_dir}\n"
            f"Description=dglkit job j1\nExecStart={{ path=/bin/sh ; argv[]={argv} ; ignore_errors=no ; "
            "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n")


def stop_args(server_port: int, master_port: int) -> argparse.Namespace:
    return argparse.Namespace(user=pwd.getpwuid(os.getuid()).pw_name, job_dir="", check=False,
                              server_port=server_port, servers=1, master_port=master_port, graph="", ports_wait=0.2)


@pytest.mark.parametrize("rewritten", [{"num_servers": "x"}, {"master_port": "busy"}, {"num_servers": 5_000_000}])
def test_stop_checks_the_ports_the_unit_started_the_job_with_not_those_of_a_rewritten_job_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rewritten: dict) -> None:
    """The job rewrote its job.json: a port that is not the job's (sshd's 22, here one this test listens on) is not
    reported as the job's, nor a port range for 5,000,000 servers checked, nor a bad value a crash."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    base = free_ports(2)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        busy = other.getsockname()[1]
        (job_dir / "job.json").write_text(json.dumps({key: busy if value == "busy" else value
                                                      for key, value in rewritten.items()}))
        show = unit_show(job_dir, f"--num-servers 1 --master-port {base + 1} --part-config /srv/p/mygraph.json")
        unit = {**describe(parse_show(show)), "partition": mpiunit.describe({})}  # no partition running
        monkeypatch.setattr("dglkit.control.show_unit", lambda: unit)
        left = stop(stop_args(busy - 10 if "num_servers" in rewritten else base, base + 1))["left"]
        assert not [entry for entry in left if entry.startswith("port(s)")], left
        assert unit["launched"] == {"num_servers": 1, "master_port": base + 1, "part_config": "/srv/p/mygraph.json"}
        # A unit of an earlier version records nothing: job.json's values count where they are valid, else the
        # command's own.
        unit = {**describe(parse_show(unit_show(job_dir, ""))), "partition": mpiunit.describe({})}
        assert unit["launched"] == {}
        monkeypatch.setattr("dglkit.control.show_unit", lambda: unit)
        left = [entry for entry in stop(stop_args(base, base + 1))["left"] if entry.startswith("port(s)")]
        assert left == ([f"port(s) {busy} listening"] if "master_port" in rewritten else []), left


def test_a_graph_name_from_a_file_is_no_pattern(tmp_path: Path) -> None:
    (tmp_path / "unrelated").write_bytes(b"x")
    args = argparse.Namespace(server_port=free_ports(1), servers=1, master_port=free_ports(1), graph="", ports_wait=0)
    assert leftovers(str(tmp_path / "job"), {"part_config": "/srv/p/*.json"}, args, tmp_path) == []


def test_stop_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "STOP").symlink_to(victim)
    as_account(pwd.getpwuid(os.getuid()).pw_name, lambda: request_stop(str(job_dir)))
    assert victim.read_text() == "root's\n"
    assert not (job_dir / "STOP").is_symlink() and (job_dir / "STOP").read_text() == "stopped by playbooks/stop.yml\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")
def test_the_job_account_reads_with_its_own_rights_only(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    assert as_account("nobody", lambda: [os.getuid(), os.getgid(), os.getgroups()]) == [nobody.pw_uid, nobody.pw_gid, []]
    with pytest.raises(UserError, match="PermissionError"):
        as_account("nobody", lambda: secret.read_text())


def make_job(jobs: Path, name: str, state: str, age: float) -> Path:
    """A job directory as the launchers leave it: job.json, a node's status.json and an epoch in metrics.jsonl."""
    job_dir = jobs / name
    (job_dir / "nodes/node2").mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"train": {"num_epochs": 3}, "train_args": ["--settings", "job.json"]}))
    (job_dir / "nodes/node2/status.json").write_text(json.dumps({"node": "node2", "state": state}))
    (job_dir / "metrics.jsonl").write_text(json.dumps({"event": "epoch", "epoch": 2, "loss": 0.5}) + "\n")
    os.utime(job_dir, (time.time() - age, time.time() - age))
    return job_dir


def test_status_reports_the_running_job_then_the_last_one_then_the_newest(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    old, new = make_job(jobs, "old", "succeeded", 100), make_job(jobs, "new", "succeeded", 10)
    (jobs / ".start.lock").mkdir()
    (jobs / "link").symlink_to(old)
    assert job_dirs(jobs) == [new, old] and pick_job(jobs, []) == new
    ran, runs = {"job_dir": str(old), "running": False}, {"job_dir": str(new), "running": True}
    assert pick_job(jobs, [ran]) == old and pick_job(jobs, [ran, runs]) == new
    assert pick_job(jobs, [{"job_dir": str(jobs / "deleted"), "running": False}]) == new
    assert pick_job(tmp_path / "none", []) is None


def test_status_shows_each_unit_the_progress_line_of_watch_and_the_hosts_not_reached(dglkit, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    result = json.loads(dglkit("control", "progress", "--jobs", jobs).stdout)
    assert result == {"changed": False, "job": None, "state": None, "lines": [f"no job in {jobs} yet"]}
    j1 = make_job(jobs, "j1", "succeeded", 0)
    units = {"node2": {"job_dir": str(j1), "running": False, "line": "node2: no job running"}, "node3": None}
    result = json.loads(dglkit("control", "progress", "--jobs", jobs, "--units", json.dumps(units)).stdout)
    assert result["state"] == "succeeded" and result["lines"] == [
        "node2: no job running", "j1: succeeded: epoch 3/3 loss 0.5000 [node2 succeeded]",
        "could not reach node3: its job unit is not shown (the progress above is the shared job directory's)"]


def test_ready_reads_ip_config_as_stat_would_and_waits_for_ports_to_close(tmp_path: Path) -> None:
    assert file_record(tmp_path / "ip_config.txt") == {"exists": False}
    (tmp_path / "ip_config.txt").write_text("10.0.0.2 30050\n\n 10.0.0.3 30050 \n")
    record = file_record(tmp_path / "ip_config.txt")
    assert record["lines"] == ["10.0.0.2 30050", "10.0.0.3 30050"]
    assert record["mtime"] == (tmp_path / "ip_config.txt").stat().st_mtime
    # Ansible's stat checksum is SHA-1: the same file gives the same record wherever it is read.
    assert record["checksum"] == subprocess.run(["sha1sum", str(tmp_path / "ip_config.txt")], capture_output=True,
                                                text=True, check=True).stdout.split()[0]
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        started = time.monotonic()
        assert still_listening([port], 0.4) == [port]
        assert time.monotonic() - started >= 0.4
    assert still_listening([port], 5) == []


def test_ready_on_the_storage_host_takes_the_starters_lock_before_it_looks_for_the_earlier_run(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No systemd on this machine: the unit's state is the e2e tier's to read (test_jobs.py).
    monkeypatch.setattr("dglkit.control.show_unit", lambda: {"running": False})
    lock, job = tmp_path / "jobs" / ".start.lock", tmp_path / "jobs" / "job-1"
    storage = ["control", "ready", "--workspace", tmp_path, "--lock", lock, "--lock-owner", "ann on ctl starting job-1",
               "--job-dir", job, "--nodes", "node0"]
    code, answer, _ = cli(*storage)
    assert code == 0 and answer["lock"] == {"taken": True, "held_by": None} and answer["previous"] == {"state": "new"}
    assert (lock / "owner").read_text() == "ann on ctl starting job-1\n"
    # A second starter is told who holds it and looks no further: the holder may be changing the job directory.
    code, answer, _ = cli(*storage)
    assert answer["lock"] == {"taken": False, "held_by": "ann on ctl starting job-1"} and "previous" not in answer
    assert cli("control", "release", "--lock", lock)[0] == 0 and not lock.exists()
    # A look that fails after the lock was taken leaves no lock behind: the playbook releases only what it was told of.
    job.parent.mkdir(exist_ok=True)
    (job / "job.json").parent.mkdir()
    (job / "job.json").write_text("{}")
    code, _, err = cli(*storage[:-2], "--nodes", "")
    assert code == 2 and "no nodes" in err and not lock.exists()


PARTITION_SHOW = ("ActiveState={}\nExecStart={{ path=/srv/dglkit/venv/bin/python ; argv[]=/srv/dglkit/venv/bin/python -m "
                  "dglkit mpi run --dataset-dir /srv/dglkit/datasets/d --out /srv/dglkit/partitions/p/2part --graph-name "
                  "g --hosts node2=10.77.0.12,node3=10.77.0.13 ; ignore_errors=no ; start_time=[n/a] ; pid=0 }}\n")


@pytest.mark.parametrize("active", ["active", "deactivating", "inactive", "failed"])
def test_the_partition_unit_names_its_directory_and_hosts_from_its_own_command_line(active: str) -> None:
    unit = mpiunit.describe(parse_show(PARTITION_SHOW.format(active)), "node2")
    if active in ("active", "deactivating"):
        assert unit == {"running": True, "state": active, "out": "/srv/dglkit/partitions/p/2part",
                        "hosts": {"node2": "10.77.0.12", "node3": "10.77.0.13"}, "line": f"node2: partition (mpi) {active}"}
    else:
        assert unit == {"running": False, "state": active, "out": "", "hosts": {}, "line": ""}


def test_the_ranks_of_a_partition_are_found_by_their_environment_and_waited_for(tmp_path: Path) -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    rank = subprocess.Popen(sleep, env={**os.environ, PROGRESS_ENV: str(tmp_path / "progress")})
    mention = subprocess.Popen([*sleep, f"{PROGRESS_ENV}={tmp_path}"], env={**os.environ, "X": f"{PROGRESS_ENV}=1"})
    try:
        assert [line.split(":")[0] for line in mpiunit.rank_processes(0)] == [str(rank.pid)]
        threading.Timer(0.5, rank.kill).start()
        started = time.monotonic()
        assert mpiunit.rank_processes(10) == [] and time.monotonic() - started < 5
    finally:
        rank.kill()
        mention.kill()
        rank.wait()

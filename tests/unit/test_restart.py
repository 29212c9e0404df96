"""Checkpoints, heartbeats and automatic restarts of `dglkit launch` with real DGL servers and trainers."""

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from dglkit.common import read_json
from dglkit.launcher.supervise import HeartbeatWatch
from localjob import (
    TRAIN_ARGS,
    assert_job_gone,
    checkpointed_epochs,
    epochs_done,
    free_ports,
    kill_trainer_after,
    start_launch,
    start_local_job,
)


def start_restartable_job(job_dir: Path, part_config: Path, epochs: int):
    """A --local job with one restart allowed: (launcher, ports, /dev/shm before)."""
    shm_before = set(os.listdir("/dev/shm"))
    launch, ports = start_local_job(job_dir, part_config, "n1", "--max-restarts", 1, "--grace", 5, "--restart-wait", 30,
                                    train_args=["--num-epochs", str(epochs), "--batch-size", "200", "--lr", "0.01",
                                                "--num-hidden", "16", "--log-every", "5"])
    return launch, ports, shm_before


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_trainer_restarts_from_the_checkpoint_and_completes(partition_1, tmp_path):
    job_dir = tmp_path / "job"
    # Long enough to kill a trainer after a checkpoint and before the end.
    launch, ports, shm_before = start_restartable_job(job_dir, partition_1, 12)
    kill_trainer_after(job_dir, launch, 3, "n1")

    assert launch.wait(timeout=600) == 0, (job_dir / "launch.out").read_text()[-3000:]
    # The first attempt's failure and logs are kept apart from the second's.
    failed = json.loads((job_dir / "attempts/1/FAILED").read_text())
    assert failed["attempt"] == 1 and failed["process"] == "trainer-1" and failed["exit_code"] == -9
    assert "exited with signal SIGKILL" in (job_dir / "attempts/1/nodes/n1/launcher.log").read_text()
    assert (job_dir / "attempts/1/nodes/n1/trainer-1.log").is_file() and (job_dir / "nodes/n1/trainer-1.log").is_file()
    assert "resumed from" in (job_dir / "nodes/n1/trainer-0.log").read_text()
    assert not (job_dir / "FAILED").exists()
    status = json.loads((job_dir / "nodes/n1/status.json").read_text())
    assert status["state"] == "succeeded" and status["attempt"] == 2
    # The curves continue: every epoch once, in order, a resume record where the second attempt began.
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics if m["event"] == "epoch"] == list(range(12))
    resume = next(m for m in metrics if m["event"] == "resume")
    assert 3 <= resume["epoch"] < 12 and resume["attempt"] == 2
    assert metrics[-1]["event"] == "test" and metrics[-1]["test_acc"] > 0.6
    assert_job_gone(job_dir, ports, shm_before)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_restarts_run_out_and_fail_the_job(partition_1, tmp_path):
    job_dir = tmp_path / "job"
    launch, ports, shm_before = start_restartable_job(job_dir, partition_1, 500)
    for attempt in (1, 2):
        deadline = time.time() + 480
        while True:
            status = read_json(job_dir / "nodes/n1/status.json") or {}
            if status.get("attempt") == attempt and status["state"] == "running" and epochs_done(job_dir):
                break
            assert launch.poll() is None and time.time() < deadline, (job_dir / "launch.out").read_text()[-3000:]
            time.sleep(0.3)
        server = next(p["pid"] for p in status["processes"] if p["name"] == "server-0")
        os.kill(server, signal.SIGKILL)
    assert launch.wait(timeout=300) == 1
    failed = json.loads((job_dir / "FAILED").read_text())
    assert failed["attempt"] == 2 and failed["process"] == "server-0"
    assert json.loads((job_dir / "attempts/1/FAILED").read_text())["attempt"] == 1
    assert "no restarts left" in json.loads((job_dir / "nodes/n1/status.json").read_text())["reason"]
    assert_job_gone(job_dir, ports, shm_before)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_launcher_started_again_mid_attempt_restarts_the_job(partition_1, tmp_path):
    """What a host does when it comes back from a reboot: its launcher finds its own status in the middle of
    the attempt, fails that attempt and the job resumes from its checkpoint."""
    job_dir = tmp_path / "job"
    launch, ports, shm_before = start_restartable_job(job_dir, partition_1, 12)
    deadline = time.time() + 480
    while checkpointed_epochs(job_dir) < 3:
        assert launch.poll() is None and time.time() < deadline, (job_dir / "launch.out").read_text()[-3000:]
        time.sleep(0.3)
    launch.kill()  # its servers and trainers get SIGTERM from the kernel (PR_SET_PDEATHSIG)
    launch.wait()
    # What systemd does with the rest of the job unit's control group once its launcher is gone (KillMode=mixed,
    # TimeoutStopSec=30): SIGKILL for what is left after 30 s. DGL's own SIGTERM handler exits through its C++
    # cleanup, which can hang on a loaded machine.
    stop_after = time.time() + 30
    while left := running_job_processes(job_dir):
        if time.time() > stop_after:
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        assert time.time() < stop_after + 30, f"the killed launcher's processes did not exit: {left}"
        time.sleep(0.5)

    again, more_ports, _ = start_restartable_job(job_dir, partition_1, 12)
    assert again.wait(timeout=600) == 0, (job_dir / "launch.out").read_text()[-3000:]
    failed = json.loads((job_dir / "attempts/1/FAILED").read_text())
    assert failed["process"] == "launcher" and "started again during attempt 1" in failed["reason"]
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics if m["event"] == "epoch"] == list(range(12))
    assert any(m["event"] == "resume" and m["epoch"] >= 3 for m in metrics)
    # Started once more after the end, it does nothing.
    last, last_ports, _ = start_restartable_job(job_dir, partition_1, 12)
    assert last.wait(timeout=60) == 0 and "succeeded" in (job_dir / "launch.out").read_text()
    assert json.loads((job_dir / "nodes/n1/status.json").read_text())["attempt"] == 2
    assert_job_gone(job_dir, ports + more_ports + last_ports, shm_before)


def running_job_processes(job_dir: Path) -> list[psutil.Process]:
    """The processes of the job in job_dir that have not exited (zombies have)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (safe_environ(process).get("DGL_IP_CONFIG", "").startswith(str(job_dir))
                    and process.status() != psutil.STATUS_ZOMBIE):
                found.append(process)
    return found


def safe_environ(proc: psutil.Process) -> dict:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def test_heartbeats_are_judged_by_the_launchers_clock(tmp_path):
    """The counter's content matters, never a time written by the program or a file's time."""
    watch = HeartbeatWatch(tmp_path)
    assert watch.stalled(0.2) is None  # no heartbeat: never stalled
    beat = tmp_path / "heartbeat-0"
    beat.write_text("1\n")
    os.utime(beat, (0, 0))  # a writer whose clock is decades off
    assert watch.stalled(0.2) is None
    time.sleep(0.3)
    assert watch.stalled(0.2) == beat
    beat.write_text("2\n")
    assert watch.stalled(0.2) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_node_that_never_comes_back_fails_the_job_at_the_first_barrier(cli, partition_2, tmp_path):
    """Node b is gone (its launcher never starts): attempt 1 fails it as silent, the barrier waits for it once, and
    attempt 2, which cannot start, is the job's last whatever restarts are left, naming b."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    servers, master = free_ports(2), free_ports(1)
    (job_dir / "ip_config.txt").write_text(f"127.0.0.1 {servers}\n127.0.0.1 {servers + 1}\n")
    shm_before = set(os.listdir("/dev/shm"))
    (job_dir / "job.json").write_text(json.dumps({
        "ip_config": str(job_dir / "ip_config.txt"), "part_config": str(partition_2), "machine_id": 0, "nodes": ["a", "b"],
        "master_port": master, "max_restarts": 2, "restart_wait": 10, "stale_after": 10, "grace": 5,
        "train_args": TRAIN_ARGS}))
    launch = start_launch(job_dir, "--config", job_dir / "job.json", "--node-name", "a")
    assert launch.wait(timeout=240) == 1, (job_dir / "launch.out").read_text()[-3000:]
    failed = json.loads((job_dir / "FAILED").read_text())
    assert (failed["attempt"], failed["node"], failed["started"]) == (2, "b", False), failed
    assert "b did not come back within 10 s" in failed["reason"]
    assert not (job_dir / "attempts/2").exists()
    status = json.loads((job_dir / "nodes/a/status.json").read_text())
    assert status["state"] == "failed" and "a node it needs is gone: not restarting" in status["reason"], status
    code, watched, _ = cli("watch", "--job-dir", job_dir, "--nodes", "a,b", "--stale-after", 600)
    assert watched["state"] == "failed" and watched["failed_node"] == "b", watched
    assert "1 attempt ran (at most 3); attempt 2 did not start" in watched["message"], watched["message"]
    assert_job_gone(job_dir, [servers, servers + 1, master], shm_before)


def test_a_launcher_that_starts_after_the_job_failed_does_nothing_and_succeeds(cli, partition_1, tmp_path):
    """A host that was down when the job failed for good boots with the job's unit enabled: its launcher exits 0
    (so the unit disables itself) and starts nothing; `--check` still refuses the job directory."""
    job_dir = tmp_path / "job"
    (job_dir / "attempts/1").mkdir(parents=True)
    record = {"node": "n3", "process": "node", "reason": "node(s) n3 did not come back within 15 s", "attempt": 2,
              "started": False}
    (job_dir / "attempts/1/FAILED").write_text(json.dumps({**record, "attempt": 1, "started": True}))
    (job_dir / "FAILED").write_text(json.dumps(record))
    args = ("launch", "--job-dir", job_dir, "--local", "--part-config", partition_1, "--node-name", "n3",
            "--max-restarts", 1, "--server-port", free_ports(2), "--master-port", free_ports(1))
    code, result, err = cli(*args)
    assert code == 0 and result["state"] == "failed" and not (job_dir / "nodes").exists(), (result, err)
    assert "the job failed on node n3 (no restarts left): nothing to do on n3" in err, err
    code, _, err = cli(*args, "--check")
    assert code == 2 and "FAILED exists: the job failed on node n3" in err, err

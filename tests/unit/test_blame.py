"""Which process failed first: real local jobs (DGL servers, trainers and samplers) in which one process raises,
the order of failure records across nodes, and what the report says about attempts that failed alike."""

import json
import os
import time
from pathlib import Path

import pytest

from localjob import assert_job_gone, free_ports, start_launch

FAULTS = Path(__file__).resolve().parent / "faults"
COMMAND = "python3 faults.py --graph_name {graph_name} --ip_config {ip_config} --part_config {part_config} "


def start_faulty_job(job_dir: Path, part_config: Path, fail: str, *args: object, samplers: int = 0):
    base = free_ports(3)
    launch = start_launch(job_dir, "--local", "--part-config", part_config, "--node-name", "n1", "--num-servers", 2,
                          "--num-trainers", 2, "--num-samplers", samplers, "--server-port", base,
                          "--master-port", base + 2, "--grace", 5, "--program-dir", FAULTS, *args,
                          "--command", COMMAND + f"--fail {fail} --fail_id 1")
    return launch, [base, base + 1, base + 2]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail, process, error", [
    ("trainer", "trainer-1", "RuntimeError: injected trainer failure in rank 1"),
    ("sampler", "trainer-1-sampler", "ValueError: injected sampler failure in trainer 1's sampler"),
    ("server", "server-1", "KeyError: 'injected server failure in server 1'"),
])
def test_the_process_that_raised_is_named_with_its_traceback(cli, partition_1, tmp_path, fail, process, error):
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    launch, ports = start_faulty_job(job_dir, partition_1, fail, samplers=1 if fail == "sampler" else 0)
    assert launch.wait(timeout=240) == 1, (job_dir / "launch.out").read_text()[-3000:]
    failed = json.loads((job_dir / "FAILED").read_text())
    assert failed["process"] == process and failed["reason"].startswith(error), failed
    assert any("faults.py" in line for line in failed["log_tail"]) and error in failed["log_tail"][-1], failed
    code, watched, _ = cli("watch", "--job-dir", job_dir, "--nodes", "n1")
    assert watched["state"] == "failed" and watched["process"] == process, watched
    assert watched["message"].startswith(f"failed on n1: {process}: {error}"), watched
    assert f"(at {FAULTS}/faults.py:" in watched["message"], watched
    assert error in watched["log_tail"][-1] and watched["log"] == f"the traceback of {process}", watched
    # Nothing to resume from: no advice to resume.
    assert "wrote no checkpoint.pt" in watched["message"] and "dgl_job_resume" not in watched["message"]
    code, reported, err = cli("report", "--job-dir", job_dir)
    assert code == 0, err
    summary = (job_dir / "summary.txt").read_text()
    assert f"failed on n1: {process}: {error}" in summary and "no epoch finished" in summary, summary
    assert_job_gone(job_dir, ports, shm_before)

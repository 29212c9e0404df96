"""Which process failed first: real local jobs (DGL servers, trainers and samplers) in which one process raises,
the order of failure records across nodes, and what the report says about attempts that failed alike."""

import json
import os
import time
from pathlib import Path

import pytest

from dglkit.blame import repeats
from localjob import assert_job_gone, local_ports, start_launch

FAULTS = Path(__file__).resolve().parent / "faults"
COMMAND = "python3 faults.py --graph_name {graph_name} --ip_config {ip_config} --part_config {part_config} "


def start_faulty_job(job_dir: Path, part_config: Path, fail: str, *args: object, samplers: int = 0, fail_id: int = 1,
                     features: str = "feat"):
    ports_options, ports = local_ports(1)
    launch = start_launch(job_dir, "--local", "--part-config", part_config, "--node-name", "n1", *ports_options,
                          "--num-trainers", 2, "--num-samplers", samplers, "--grace", 5, "--program-dir", FAULTS, *args,
                          "--command", COMMAND + f"--fail {fail} --fail_id {fail_id} --features {features}")
    return launch, ports


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail, process, error", [
    ("trainer", "trainer-1", "RuntimeError: injected trainer failure in rank 1"),
    ("sampler", "trainer-1-sampler", "ValueError: injected sampler failure in trainer 1's sampler"),
    ("server", "server-0", "KeyError: 'injected server failure in server 0'"),
])
def test_the_process_that_raised_is_named_with_its_traceback(cli, partition_1, tmp_path, fail, process, error):
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    launch, ports = start_faulty_job(job_dir, partition_1, fail, samplers=1 if fail == "sampler" else 0,
                                     fail_id=0 if fail == "server" else 1)
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


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_same_error_without_progress_stops_the_restarts(cli, partition_1, tmp_path):
    """A trainer that raises at the same line in every attempt, before any epoch: the second attempt fails as the
    first did, so the launcher does not use its last restart, and the report says why."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text(json.dumps({"max_restarts": 2, "restart_wait": 30}))  # as train.yml writes it
    launch, _ = start_faulty_job(job_dir, partition_1, "trainer", "--config", job_dir / "job.json")
    assert launch.wait(timeout=360) == 1, (job_dir / "launch.out").read_text()[-3000:]
    failed = json.loads((job_dir / "FAILED").read_text())
    assert failed["attempt"] == 2 and failed["process"] == "trainer-1", failed
    assert json.loads((job_dir / "attempts/1/FAILED").read_text())["process"] == "trainer-1"
    status = json.loads((job_dir / "nodes/n1/status.json").read_text())
    assert "failed as attempt 1 did" in status["reason"] and "not restarting" in status["reason"], status
    code, watched, _ = cli("watch", "--job-dir", job_dir, "--nodes", "n1")
    assert watched["state"] == "failed" and watched["attempts_run"] == 2 and watched["same_error"], watched
    assert "failed 2 times with the same error, making no progress in between: not restarting again" in \
        watched["message"] and "dgl_job_resume" not in watched["message"], watched
    code, _, err = cli("report", "--job-dir", job_dir)
    summary = (job_dir / "summary.txt").read_text()
    assert code == 0 and "restart         attempt 1 failed on n1 (trainer-1: RuntimeError: injected trainer " \
        "failure in rank 1" in summary and "started over (no checkpoint)" in summary, summary


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_program_that_reads_node_data_the_partition_lacks_is_told_the_setting(cli, partition_1, tmp_path):
    """A program that reads `features` (DGL's examples) from a partition whose node data is `feat`: every trainer
    raises KeyError in DGL's DistGraph. The message names dgl_job_node_data_names, and a trainer that raised on its
    own is never one that "stopped because of it"."""
    job_dir = tmp_path / "job"
    launch, _ = start_faulty_job(job_dir, partition_1, "none", features="features")
    assert launch.wait(timeout=240) == 1, (job_dir / "launch.out").read_text()[-3000:]
    code, watched, _ = cli("watch", "--job-dir", job_dir, "--nodes", "n1")
    assert watched["state"] == "failed" and watched["reason"].endswith("KeyError: 'features'"), watched
    assert "dist_graph.py" in watched["message"] and "'features' is node data the partition does not have: " \
        "dgl_job_node_data_names serves a partition's names under those your program reads (e.g. {feat: features})" \
        in watched["message"], watched["message"]
    stopped = watched["message"].partition("stopped because of it: ")[2].partition("; ")[0]
    assert "KeyError" not in stopped, watched["message"]


def write_record(path: Path, record: dict, stamp: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    os.utime(path, (stamp, stamp))


def test_the_process_that_failed_first_is_blamed_not_the_node_that_noticed_first(cli, tmp_path):
    """node3's trainer raised; node2's trainer lost its gloo peer, and node2's launcher wrote FAILED first. The
    records' times on the shared filesystem, and what each process says, name node3's trainer. The processes'
    own clocks (node3's is 10 minutes behind) play no part."""
    now = time.time()
    (tmp_path / "job.json").write_text(json.dumps({"max_restarts": 0, "nodes": ["node2", "node3"]}))
    reset = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:1"
    write_record(tmp_path / "nodes/node2/failure-11.json", {
        "node": "node2", "process": "trainer-0", "pid": 11, "error": reset, "where": "distributed_c10d.py:2050 in all_reduce",
        "traceback": ["Traceback (most recent call last):", reset], "time": now}, now - 3)
    raised = "RuntimeError: injected crash on rank 1 in epoch 1"
    write_record(tmp_path / "nodes/node3/failure-22.json", {
        "node": "node3", "process": "trainer-1", "pid": 22, "error": raised, "where": "train_dist.py:72 in main",
        "traceback": ["Traceback (most recent call last):", '  File "train_dist.py", line 72, in main', raised],
        "time": now - 600}, now - 2)
    failed = {"node": "node2", "process": "trainer-0", "exit_code": None, "reason": reset, "log": "trainer-0.log",
              "log_tail": [reset], "attempt": 1, "started": True, "progress": {"epochs": 1, "checkpoint": None}}
    write_record(tmp_path / "nodes/node2/failed.json", failed, now - 1)
    (tmp_path / "FAILED").write_text(json.dumps(failed))
    for node in ("node2", "node3"):
        (tmp_path / "nodes" / node / "status.json").write_text(json.dumps({"state": "failed", "attempt": 1}))
    code, watched, _ = cli("watch", "--job-dir", tmp_path)
    assert watched["state"] == "failed" and watched["failed_node"] == "node3" and watched["process"] == "trainer-1"
    assert watched["message"].startswith(f"failed on node3: trainer-1: {raised} (at train_dist.py:72 in main); "
                                         f"stopped because of it: node2 trainer-0 ({reset})"), watched["message"]
    assert watched["log_tail"][-1] == raised and watched["log"] == "the traceback of trainer-1"


def test_a_process_that_aborted_on_its_lost_server_is_not_the_cause(cli, tmp_path):
    """node3's server was killed (SIGKILL); node2's trainer aborted (SIGABRT) on DGL's RPC check a moment later,
    and node2's launcher wrote first (node3's was slower to notice). The abort's message, deep in the log before
    the backtrace, makes node2's trainer a victim: node3's server is the cause."""
    from dglkit.launcher.failure import abort_message

    now = time.time()
    (tmp_path / "job.json").write_text(json.dumps({"max_restarts": 0, "nodes": ["node2", "node3"]}))
    log = tmp_path / "trainer-0.log"
    what = "[21:21:52] /opt/dgl/src/rpc/network/socket_communicator.cc:177: Check failed: tmp != -1 (-1 vs. -1) :"
    log.write_text("epoch 3 step 5\nterminate called after throwing an instance of 'dmlc::Error'\n"
                   f"  what():  {what} \nStack trace:\n" + "  [bt] (0) libdgl.so\n" * 12 + "Uptime: 2.0 s\n")
    assert abort_message(log) == what
    aborted = {"node": "node2", "process": "trainer-0", "exit_code": -6, "log": str(log),
               "reason": f"exited with signal SIGABRT ({abort_message(log)})", "log_tail": log.read_text().splitlines()[-12:],
               "attempt": 1, "started": True, "progress": {"epochs": 3, "checkpoint": None}}
    write_record(tmp_path / "nodes/node2/failed.json", aborted, now - 2)
    killed = {**aborted, "node": "node3", "process": "server-0", "exit_code": -9, "log": "server-0.log",
              "reason": "exited with signal SIGKILL", "log_tail": []}
    write_record(tmp_path / "nodes/node3/failed.json", killed, now - 1)
    (tmp_path / "FAILED").write_text(json.dumps(aborted))
    for node in ("node2", "node3"):
        (tmp_path / "nodes" / node / "status.json").write_text(json.dumps({"state": "failed", "attempt": 1}))
    code, watched, _ = cli("watch", "--job-dir", tmp_path)
    assert watched["failed_node"] == "node3" and watched["process"] == "server-0", watched["message"]
    assert watched["message"].startswith("failed on node3: server-0: exited with signal SIGKILL; stopped because "
                                         "of it: node2 trainer-0 (exited with signal SIGABRT ("), watched["message"]


@pytest.mark.parametrize("attempts, checkpoint, expected, unexpected", [
    # The same exception at the same place in all three attempts; the job wrote no checkpoint.
    ([("trainer-1", "KeyError: 'features'", "train.py:40 in main", True)] * 3, False,
     ["failed on node3: trainer-1: KeyError: 'features'", "failed 3 times with the same error",
      "the job wrote no checkpoint.pt"], ["dgl_job_resume"]),
    # ... with a checkpoint to continue from.
    ([("trainer-1", "KeyError: 'features'", "train.py:40 in main", True)] * 3, True,
     ["failed 3 times with the same error", "-e dgl_job_resume=true continues from the last checkpoint"], []),
    # A worker that stays down: attempt 2 never started.
    ([("node", "node node3 silent: its status.json is 31 s old", None, True),
      ("node", "node(s) node3 did not come back within 15 s", None, False)], True,
     ["failed on node3: node: node(s) node3 did not come back within 15 s", "1 attempt ran (at most 2)",
      "attempt 2 did not start"], ["attempt 2 of at most 2", "same error"]),
    # ... with two restarts, as a launcher that waited at the barrier once per restart left it: one attempt ran.
    ([("node", "node node3 silent: its status.json is 31 s old", None, True),
      ("node", "node(s) node3 did not come back within 15 s", None, False),
      ("node", "node(s) node3 did not come back within 15 s", None, False)], True,
     ["1 attempt ran (at most 3)", "attempt 3 did not start"], ["2 attempts ran", "same error"]),
])
def test_the_message_tells_the_attempts_that_ran(cli, tmp_path, attempts, checkpoint, expected, unexpected):
    (tmp_path / "job.json").write_text(json.dumps({"max_restarts": len(attempts) - 1, "nodes": ["node2", "node3"]}))
    for number, (process, reason, where, started) in enumerate(attempts, 1):
        record = {"node": "node3", "process": process, "reason": reason, "where": where, "attempt": number,
                  "started": started, "log_tail": [reason], "progress": {"epochs": 0, "checkpoint": None}}
        (tmp_path / ("FAILED" if number == len(attempts) else f"attempts/{number}/FAILED")).parent.mkdir(
            parents=True, exist_ok=True)
        (tmp_path / ("FAILED" if number == len(attempts) else f"attempts/{number}/FAILED")).write_text(json.dumps(record))
    if checkpoint:
        (tmp_path / "checkpoint.pt").write_bytes(b"")
    for node in ("node2", "node3"):
        (tmp_path / "nodes" / node).mkdir(parents=True, exist_ok=True)
        (tmp_path / "nodes" / node / "status.json").write_text(json.dumps({"state": "failed", "attempt": len(attempts)}))
    code, watched, _ = cli("watch", "--job-dir", tmp_path)
    assert watched["state"] == "failed", watched
    assert all(text in watched["message"] for text in expected), watched["message"]
    assert not any(text in watched["message"] for text in unexpected), watched["message"]
    # Every job that started gets a summary, failed ones too.
    code, _, err = cli("report", "--job-dir", tmp_path)
    assert code == 0, err
    summary = (tmp_path / "summary.txt").read_text()
    assert f"outcome         {watched['message']}" in summary and "no epoch finished" in summary, summary


def test_a_node_that_stayed_down_is_blamed_by_the_attempt_it_missed(cli, tmp_path):
    """node3 went down in attempt 1 and never came back: its launcher's record of attempt 1 is still in nodes/node3/
    (it could not move it to attempts/1/); attempt 2 failed because node3 did not come back, and says so."""
    (tmp_path / "job.json").write_text(json.dumps({"max_restarts": 1, "nodes": ["node2", "node3"]}))
    now = time.time()
    first = {"node": "node3", "process": "launcher", "exit_code": None, "log_tail": [], "attempt": 1, "started": True,
             "reason": "received SIGTERM without a stop request (host shutting down?)"}
    write_record(tmp_path / "nodes/node3/failed.json", first, now - 60)
    (tmp_path / "attempts/1").mkdir(parents=True)
    (tmp_path / "attempts/1/FAILED").write_text(json.dumps(first))
    second = {"node": "node3", "process": "node", "exit_code": None, "log_tail": [], "attempt": 2, "started": False,
              "reason": "node(s) node3 did not come back within 15 s"}
    write_record(tmp_path / "nodes/node2/failed.json", second, now - 1)
    (tmp_path / "FAILED").write_text(json.dumps(second))
    (tmp_path / "nodes/node2/status.json").write_text(json.dumps({"state": "failed", "attempt": 2}))
    code, watched, _ = cli("watch", "--job-dir", tmp_path, "--nodes", "node2")
    assert watched["message"].startswith("failed on node3: node: node(s) node3 did not come back within 15 s; "
                                         "1 attempt ran (at most 2); attempt 2 did not start"), watched["message"]
    code, _, err = cli("report", "--job-dir", tmp_path)
    assert "restart         attempt 1 failed on node3 (launcher: received SIGTERM" in (tmp_path / "summary.txt").read_text()


def test_the_same_error_on_trainers_of_two_nodes_is_the_same_error(cli, tmp_path):
    """The same bug strikes whichever trainer gets there first: node2's trainer-0 in attempt 1, node3's trainer-1
    in attempt 2, no progress in between. The launchers stop restarting, and the report says why."""
    (tmp_path / "job.json").write_text(json.dumps({"max_restarts": 2, "nodes": ["node2", "node3"]}))
    error = "ZeroDivisionError: division by zero"
    for number, (node, process) in enumerate([("node2", "trainer-0"), ("node3", "trainer-1")], 1):
        record = {"node": node, "process": process, "reason": error, "where": "train.py:40 in main", "attempt": number,
                  "started": True, "log_tail": [error], "progress": {"epochs": 0, "checkpoint": None}}
        path = tmp_path / ("FAILED" if number == 2 else "attempts/1/FAILED")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    for node in ("node2", "node3"):
        (tmp_path / "nodes" / node).mkdir(parents=True)
        (tmp_path / "nodes" / node / "status.json").write_text(json.dumps({"state": "failed", "attempt": 2}))
    assert repeats(tmp_path, json.loads((tmp_path / "FAILED").read_text()))
    code, watched, _ = cli("watch", "--job-dir", tmp_path)
    assert watched["state"] == "failed" and watched["same_error"], watched
    assert "failed 2 times with the same error, making no progress in between: not restarting again" in \
        watched["message"], watched["message"]
    # A server that exits as a trainer did is another failure.
    record = json.loads((tmp_path / "FAILED").read_text())
    (tmp_path / "FAILED").write_text(json.dumps({**record, "process": "server-0"}))
    assert not repeats(tmp_path, json.loads((tmp_path / "FAILED").read_text()))


def test_a_process_with_an_error_of_its_own_did_not_stop_because_of_the_cause(cli, tmp_path):
    """Both trainers read node data the partition does not have; node3's raised first. node2's trainer failed on its
    own, not because of node3's; node2's server lost its peer. The message tells them apart and names the setting."""
    now = time.time()
    (tmp_path / "job.json").write_text(json.dumps({"max_restarts": 0, "nodes": ["node2", "node3"]}))
    error = "KeyError: 'features'"
    traceback = ["Traceback (most recent call last):", '  File "/p/train_dist.py", line 72, in main',
                 "    x = g.ndata['features'][input_nodes]",
                 '  File "/v/dgl/distributed/dist_graph.py", line 263, in __getitem__', "    return self._data[key]", error]
    for node, process, stamp in (("node3", "trainer-1", now - 3), ("node2", "trainer-0", now - 2)):
        write_record(tmp_path / f"nodes/{node}/failure-1.json", {
            "node": node, "process": process, "pid": 1, "error": error, "traceback": traceback, "time": now,
            "where": "/v/dgl/distributed/dist_graph.py:263 in __getitem__"}, stamp)
    reset = "RuntimeError: Connection reset by peer"
    write_record(tmp_path / "nodes/node2/failure-2.json", {"node": "node2", "process": "server-0", "pid": 2,
                                                           "error": reset, "traceback": [reset], "time": now}, now - 1)
    failed = {"node": "node3", "process": "trainer-1", "reason": error, "attempt": 1, "started": True,
              "log_tail": traceback, "progress": {"epochs": 0, "checkpoint": None}}
    (tmp_path / "FAILED").write_text(json.dumps(failed))
    for node in ("node2", "node3"):
        (tmp_path / "nodes" / node / "status.json").write_text(json.dumps({"state": "failed", "attempt": 1}))
    code, watched, _ = cli("watch", "--job-dir", tmp_path)
    assert watched["message"].startswith(
        f"failed on node3: trainer-1: {error} (at /v/dgl/distributed/dist_graph.py:263 in __getitem__); "
        f"stopped because of it: node2 server-0 ({reset}); also failed on its own: node2 trainer-0 ({error}); "
        "'features' is node data the partition does not have: dgl_job_node_data_names serves a partition's names "
        "under those your program reads (e.g. {feat: features})"), watched["message"]

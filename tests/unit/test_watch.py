"""`dglkit watch` on the status files of real runs; SIGTERM to a running launcher."""

import base64
import io
import json
import os
import shutil
import signal
import tarfile
import threading
import time

import pytest

from dglkit.jobstate import earlier_run
from localjob import ENDLESS_TRAIN_ARGS, assert_job_gone, start_local_job


def test_finished_job_is_succeeded_with_its_last_epoch(cli, finished_local_job):
    started = time.time()
    code, result, _ = cli("watch", "--job-dir", finished_local_job, "--nodes", "node0", "--wait", 30)
    assert code == 0 and time.time() - started < 5  # nothing more will change: no waiting
    assert result["state"] == "succeeded" and result["nodes"] == {"node0": "succeeded"}
    assert result["progress"]["event"] == "epoch" and result["progress"]["epoch"] == 5
    assert result["failed_node"] is None and result["changed"] is False


def test_a_job_that_succeeded_is_summarised_and_packed_in_the_same_answer(cli, finished_local_job, tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(finished_local_job, job_dir)
    (job_dir / "summary.json").unlink(missing_ok=True)
    code, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "node0", "--pack", r"nodes/.*|summary\.txt|curves\.png")
    assert code == 0 and result["state"] == "succeeded"
    packed = result["packed"]
    assert packed["reported"] and packed["report_error"] is None and packed["skipped"] == [], packed
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(packed["archive_base64"]))) as archive:
        names = set(archive.getnames())
    assert {"nodes/node0/status.json", "nodes/node0/launcher.log", "summary.txt", "curves.png"} <= names, names
    assert "metrics.jsonl" not in names
    # A job that did not succeed is not packed here: train.yml stops it everywhere first.
    (job_dir / "STOP").touch()
    code, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "node0", "--pack", ".*")
    assert code == 0 and result["state"] == "stopped" and "packed" not in result


def copy_job(job_dir, tmp_path):
    copy = tmp_path / "job"
    shutil.copytree(job_dir / "nodes", copy / "nodes")
    shutil.copy(job_dir / "metrics.jsonl", copy)
    return copy


def test_a_node_whose_status_went_stale_fails_the_job(cli, finished_local_job, tmp_path):
    job_dir = copy_job(finished_local_job, tmp_path)
    status = json.loads((job_dir / "nodes/node0/status.json").read_text())
    # node1's launcher last wrote "running" 100 s ago (by the shared filesystem's clock): it died, or its
    # host went down.
    (job_dir / "nodes/node1").mkdir()
    (job_dir / "nodes/node1/status.json").write_text(json.dumps(
        {**status, "node": "node1", "state": "running", "updated": time.time()}))
    os.utime(job_dir / "nodes/node1/status.json", (time.time() - 100, time.time() - 100))
    code, result, _ = cli("watch", "--job-dir", job_dir, "--stale-after", 30)
    assert code == 0 and result["state"] == "failed" and result["failed_node"] == "node1"
    assert result["nodes"] == {"node0": "succeeded", "node1": "stale"} and "not updated for" in result["reason"]
    code, result, _ = cli("watch", "--job-dir", job_dir, "--stale-after", 300)
    assert result["state"] == "running" and result["nodes"]["node1"] == "running"


def test_a_node_whose_clock_is_off_is_not_stale(cli, finished_local_job, tmp_path):
    """Its own clock says it wrote its status 10 minutes ago (or ahead): only the file's time on the shared
    filesystem counts. (nspawn test hosts share the kernel's clock, so a real skewed host cannot be made there.)"""
    job_dir = copy_job(finished_local_job, tmp_path)
    status = json.loads((job_dir / "nodes/node0/status.json").read_text())
    for name, skew in (("behind", -600), ("ahead", 600)):
        (job_dir / "nodes" / name).mkdir()
        (job_dir / "nodes" / name / "status.json").write_text(json.dumps(
            {**status, "node": name, "state": "running", "updated": time.time() + skew}))
    code, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "behind,ahead", "--stale-after", 30)
    assert result["state"] == "running" and result["nodes"] == {"behind": "running", "ahead": "running"}, result


def test_a_stop_while_the_job_restarts_is_a_stop(cli, finished_local_job, tmp_path):
    """stop.yml while the launchers wait to restart (a node is down): the job is stopped, not restarting."""
    job_dir = copy_job(finished_local_job, tmp_path)
    (job_dir / "job.json").write_text(json.dumps({"max_restarts": 1}))
    (job_dir / "FAILED").write_text(json.dumps({"node": "node0", "process": "launcher", "reason": "received SIGTERM",
                                                "attempt": 1}))
    code, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "node0", "--wait", 0)
    assert result["state"] == "restarting" and result["failed_node"] == "node0", result
    (job_dir / "STOP").write_text("stopped by playbooks/stop.yml\n")
    started = time.time()
    code, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "node0", "--wait", 30)
    assert code == 0 and result["state"] == "stopped" and time.time() - started < 10, result
    # With no restarts left the failure came first: the job failed.
    (job_dir / "job.json").write_text(json.dumps({"max_restarts": 0}))
    code, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "node0", "--wait", 0)
    assert result["state"] == "failed" and result["failed_node"] == "node0", result


def test_a_node_without_status_after_the_wait_fails_the_job(cli, finished_local_job, tmp_path):
    job_dir = copy_job(finished_local_job, tmp_path)
    started = time.time()
    code, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "node0,ghost", "--wait", 2)
    assert time.time() - started >= 2
    assert result["state"] == "failed" and result["failed_node"] == "ghost" and "no " in result["reason"]


def test_missing_job_dir_is_a_clear_error(cli, tmp_path):
    code, _, err = cli("watch", "--job-dir", tmp_path / "nope")
    assert code == 2 and "nope not found" in err


def test_progress_is_reported_after_progress_after_but_a_change_of_state_at_once(cli, tmp_path):
    job = tmp_path / "job"
    (job / "nodes" / "node0").mkdir(parents=True)
    (job / "job.json").write_text("{}")
    status = job / "nodes" / "node0" / "status.json"
    status.write_text('{"state": "running", "attempt": 1}')

    def later(path, text):
        time.sleep(0.3)
        path.write_text(text)

    threading.Thread(target=later, args=(job / "metrics.jsonl", '{"event": "epoch", "epoch": 0, "loss": 1.0}\n')).start()
    started = time.time()
    code, result, _ = cli("watch", "--job-dir", job, "--nodes", "node0", "--wait", 20, "--progress-after", 2)
    assert code == 0 and result["state"] == "running" and result["progress"]["epoch"] == 0
    assert 2 <= time.time() - started < 10
    threading.Thread(target=later, args=(status, '{"state": "succeeded", "attempt": 1}')).start()
    started = time.time()
    code, result, _ = cli("watch", "--job-dir", job, "--nodes", "node0", "--wait", 20, "--progress-after", 20)
    assert code == 0 and result["state"] == "succeeded" and time.time() - started < 5


def test_a_look_for_an_earlier_run_reads_its_state_and_settings_without_following_a_link(finished_local_job, tmp_path):
    assert earlier_run(tmp_path / "never-ran", ["node0"], 30) == {"state": "new"}
    job = copy_job(finished_local_job, tmp_path)
    (job / "job.json").write_text("{}\n")
    (job / "settings.json").write_text('{"epochs": 5}\n')
    result = earlier_run(job, ["node0"], 30)
    assert result["state"] == "succeeded" and result["settings"] == {"kind": "file", "value": {"epochs": 5}}
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": 1}\n')
    (job / "settings.json").unlink()
    (job / "settings.json").symlink_to(outside)
    assert earlier_run(job, ["node0"], 30)["settings"] == {"kind": "a symbolic link", "value": None}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_watch_follows_a_running_job_and_sigterm_stops_it(cli, partition_1, tmp_path):
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    launch, ports = start_local_job(job_dir, partition_1, "n1", train_args=ENDLESS_TRAIN_ARGS)
    deadline = time.time() + 180
    result = {"progress": None}
    while result["progress"] is None:
        assert time.time() < deadline, "no epoch reported"
        _, result, _ = cli("watch", "--job-dir", job_dir, "--nodes", "n1", "--wait", 30)
        assert result["state"] == "running", result
    started = time.time()
    _, later, _ = cli("watch", "--job-dir", job_dir, "--nodes", "n1", "--wait", 60)
    # Returns on the next epoch, long before the wait is over.
    assert later["state"] == "running" and later["progress"]["epoch"] > result["progress"]["epoch"]
    assert time.time() - started < 30

    launch.send_signal(signal.SIGTERM)
    assert launch.wait(timeout=60) == 128 + signal.SIGTERM
    status = json.loads((job_dir / "nodes/n1/status.json").read_text())
    assert status["state"] == "stopped" and status["reason"] == "received SIGTERM"
    assert not (job_dir / "FAILED").exists()  # a stop is not a failure of the job's processes
    _, stopped, _ = cli("watch", "--job-dir", job_dir, "--nodes", "n1")
    assert stopped["state"] == "failed" and stopped["failed_node"] == "n1" and "SIGTERM" in stopped["reason"]
    assert_job_gone(job_dir, ports, shm_before)


def a_job(tmp_path, status: object = None, **files: object):
    """A job directory with job.json, node0's status.json (running unless given) and files by name: JSON values or
    text."""
    job = tmp_path / "job"
    (job / "nodes/node0").mkdir(parents=True)
    files = {"job.json": {}, "nodes/node0/status.json": {"state": "running", "attempt": 1} if status is None else status,
             **files}
    for name, value in files.items():
        (job / name).write_text(value if isinstance(value, str) else json.dumps(value))
    return job


EPOCH = {"event": "epoch", "epoch": 1, "loss": 0.5}


@pytest.mark.parametrize("files, state, line", [
    # Every field of FAILED of the wrong type: the job failed all the same, with each field's default.
    ({"FAILED": {"attempt": "2", "started": "no", "node": 5, "process": ["x"], "reason": {"a": 1}, "log_tail": "abc",
                 "exit_code": "1"}, "job.json": {"max_restarts": "many", "train": {"num_epochs": 3}},
      "metrics.jsonl": json.dumps(EPOCH) + "\n"},
     "failed", "failed: epoch 2/3 loss 0.5000; "),
    # A metrics.jsonl line that is an array, an epoch record whose figures are text: the last good epoch counts.
    ({"metrics.jsonl": json.dumps(EPOCH) + '\n{"event": "epoch", "epoch": "9", "loss": 1}\n[1, 2]\n'},
     "running", "running: epoch 2/? loss 0.5000 [node0 running]"),
    ({"metrics.jsonl": json.dumps({**EPOCH, "loss": "low", "epoch_time": [], "seeds_per_s": 1}) + "\n"},
     "running", "running: epoch 2/? "),
    # job.json's trainer settings of the wrong type.
    ({"job.json": {"train": "x", "train_args": "--num-epochs"}, "metrics.jsonl": json.dumps(EPOCH) + "\n"},
     "running", "running: epoch 2/? loss 0.5000 [node0 running]"),
    ({"job.json": {"train": {"num_epochs": "x"}, "train_args": ["--num-epochs", 7]}, "metrics.jsonl": json.dumps(EPOCH)},
     "running", "running: epoch 2/? loss 0.5000 [node0 running]"),
])
def test_job_written_files_of_the_wrong_type_are_read_as_their_defaults(cli, tmp_path, files, state, line):
    job = a_job(tmp_path, **files)
    code, result, err = cli("watch", "--job-dir", job, "--nodes", "node0")
    assert code == 0 and result["state"] == state and result["line"].startswith(line), (err, result)
    assert result["changed"] is False


@pytest.mark.parametrize("status, reason", [
    ("{\"state\": ", "status.json is not JSON: Expecting value"),
    ([], "status.json is not a JSON object but []"),
    ({"state": "pwned", "attempt": "x"}, 'status.json is not what the kit writes there: state is "pwned", not one of '
                                          "starting, running, restarting, succeeded, failed, stopped"),
    ({"reason": "no state"}, "status.json is not what the kit writes there: no state"),
    ('{"state": ' + "[" * 100000 + "]" * 100000 + "}", "status.json is JSON nested deeper than 20 levels"),
])
def test_a_status_that_is_not_a_launchers_says_what_is_wrong_with_it(cli, tmp_path, status, reason):
    job = a_job(tmp_path, status)
    code, result, err = cli("watch", "--job-dir", job, "--nodes", "node0")
    assert code == 0 and result["state"] == "failed" and result["nodes"] == {"node0": "unreadable"}, (err, result)
    assert result["failed_node"] == "node0" and reason in result["reason"], result
    # train.yml's look at an earlier run reads the job's state the same way.
    assert earlier_run(job, ["node0"], 30)["nodes"] == {"node0": "unreadable"}


# What a job could write to take over a terminal: clear the screen, set the window title, move the cursor (also in
# the 8-bit forms), carriage returns that overwrite a line.
ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x9b31m\x1bP+q\x1b\\\r\x07"


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def control_characters(value) -> list[str]:
    return [text for text in strings(value) if any(c < " " and c not in "\n\t" or "\x7f" <= c <= "\x9f" for c in text)]


def test_nothing_a_job_wrote_reaches_the_answer_with_a_control_character(cli, tmp_path, capsys):
    job = a_job(tmp_path, {"state": "failed", "reason": f"trainer-0: boom{ESCAPES}", "attempt": 1}, **{
        "job.json": {"train": {"num_epochs": ESCAPES}, "nodes": [f"node0{ESCAPES}"]},
        "metrics.jsonl": json.dumps({**EPOCH, f"train_acc{ESCAPES}": 0.4, "val_acc": 0.5, "epoch_time": 1.0,
                                     "seeds_per_s": 10.0}) + "\n",
        "FAILED": {"node": "node0", "process": f"trainer-0{ESCAPES}", "reason": f"boom{ESCAPES}",
                   "log_tail": [f"Traceback{ESCAPES}", "  line\twith a tab"], "attempt": 1},
        "nodes/node0/failed.json": {"node": "node0", "process": "trainer-0", "reason": f"it{ESCAPES} failed",
                                    "where": f"x.py:1{ESCAPES}", "log": "trainer-0.log", "attempt": 1,
                                    "log_tail": [f"last{ESCAPES}"]}})
    code, result, err = cli("watch", "--job-dir", job, "--nodes", "node0", "--pack", ".*")
    assert code == 0 and result["state"] == "failed", err
    assert control_characters(result) == [], control_characters(result)
    # A key's escapes go too: what is left of it is a figure the line shows.
    assert result["line"] == ("failed: epoch 2/? loss 0.5000 train_acc 0.4000 val_acc 0.5000, 1.0 s, 10 seeds/s; "
                              "node0: trainer-0: it failed [node0 failed]")
    assert result["message"].startswith("failed on node0: trainer-0: it failed (at x.py:1)") and result["log_tail"] == ["last"]
    code, reported, err = cli("report", "--job-dir", job)
    assert code == 0, err
    summary = (job / "summary.txt").read_text()
    assert "failed on node0: trainer-0: it failed" in summary and control_characters(summary) == [], summary
    assert control_characters(json.loads((job / "summary.json").read_text())) == []


def test_the_last_line_of_a_failed_job_shows_each_node_stopped(cli, tmp_path):
    """node0 failed the job; node1's launcher says so within a poll of seeing FAILED. The watch's last line shows
    node1's final state, not the "running" it had when the failure was first seen."""
    for node, state in (("node0", "failed"), ("node1", "running")):
        (tmp_path / "nodes" / node).mkdir(parents=True)
        (tmp_path / "nodes" / node / "status.json").write_text(json.dumps({"state": state, "attempt": 1}))
    (tmp_path / "FAILED").write_text(json.dumps({"node": "node0", "process": "trainer-0", "reason": "RuntimeError: x",
                                                 "attempt": 1, "started": True}))

    def node1_stops() -> None:
        time.sleep(1)
        (tmp_path / "nodes/node1/status.json").write_text(json.dumps({"state": "failed", "attempt": 1}))

    threading.Thread(target=node1_stops).start()
    code, result, _ = cli("watch", "--job-dir", tmp_path, "--wait", 10)
    assert code == 0 and result["state"] == "failed" and result["nodes"] == {"node0": "failed", "node1": "failed"}
    assert result["line"].endswith("[node0 failed, node1 failed]"), result["line"]

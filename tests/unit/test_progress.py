"""The progress of long commands (dglkit.progress) and `dglkit follow`, which runs one in the background and
answers each poll with its progress line until it ends, then with the command's own answer."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dglkit import progress
from dglkit.common import read_json

APP = Path(__file__).resolve().parents[2] / "app"


def test_the_writer_replaces_the_file_at_each_phase_and_the_reader_makes_a_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "progress.json"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(path))
    writer = progress.Progress()
    writer.begin("partition")
    assert read_json(path)["phase"] == "start"
    writer.phase("build the parts", total=4, unit="parts")
    writer.step(1)  # within PROGRESS_SECONDS of the phase's record: not written
    assert read_json(path)["done"] == 0
    writer.step(4)  # the last step always is
    record = read_json(path)
    assert {k: record[k] for k in ("command", "phase", "done", "total", "unit", "pid", "host")} == {
        "command": "partition", "phase": "build the parts", "done": 4, "total": 4, "unit": "parts",
        "pid": os.getpid(), "host": os.uname().nodename}
    line = progress.line(record, record["started"] + 42)
    assert line == f"partition: build the parts, 4/4 parts, 42 s, peak {record['peak_rss_mb']} MB"
    assert progress.line(None, time.time()) == "starting"


def test_without_the_variable_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    writer = progress.Progress()
    writer.begin("prepare")
    writer.phase("save graph.dgl")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_or_half_written_file_reads_as_none(tmp_path: Path) -> None:
    assert read_json(tmp_path / "none.json") is None
    (tmp_path / "half.json").write_text('{"phase": "sa')
    assert read_json(tmp_path / "half.json") is None


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """follow's state directory; a command a failed test left running is killed with its supervisor."""
    yield tmp_path / "state"
    for record in (tmp_path / "state").glob("*/supervisor.json"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)  # its session: supervisor and command


def follow(state: Path, command: list[str], wait: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dglkit", "follow", "--state-dir", str(state), "--wait", str(wait),
                           "--command", json.dumps(command)], cwd=APP, capture_output=True, text=True, timeout=120)


def poll_until_done(state: Path, command: list[str]) -> tuple[list[dict], subprocess.CompletedProcess]:
    """Every poll's running answer, and the answer of the poll that found the command ended."""
    polls = []
    for _ in range(600):
        answer = follow(state, command, 0.3)
        last = json.loads(answer.stdout.splitlines()[-1]) if answer.returncode == 0 else {}
        if last.get("follow") != "running":
            return polls, answer
        assert set(last) == {"follow", "line", "nodes", "changed"} and last["changed"] is False, last
        polls.append(last)
    pytest.fail(f"{command} did not end: {polls[-3:]}")


@pytest.mark.slow
def test_follow_shows_a_prepare_and_partition_running_and_then_answers_as_they_would(tmp_path: Path, state: Path) -> None:
    data, parts = tmp_path / "data", tmp_path / "parts"
    command = ["prepare", "--dataset", "synthetic", "--num-nodes", "100000", "--out", str(data), "--then",
               "partition", "--dataset-dir", str(data), "--out", str(parts), "--num-parts", "2"]
    polls, answer = poll_until_done(state, command)
    assert answer.returncode == 0, answer.stderr
    lines = [poll["line"] for poll in polls]
    # Each poll followed the one process that the first started (prepare, then partition in it).
    assert len({record["pid"] for poll in polls for record in poll["nodes"].values()}) == 1, polls
    results = [json.loads(line) for line in answer.stdout.splitlines() if line.startswith("{")]
    assert [r["changed"] for r in results] == [True, True] and results[1]["num_parts"] == 2, results
    assert any(line.startswith("prepare: ") for line in lines), lines
    assert any(line.startswith("partition: ") for line in lines), lines
    assert list(state.iterdir()) == []  # answered: its directory is gone
    # Nothing to do: the first poll answers, with what the command says.
    again = follow(state, command, 60)
    assert [json.loads(line)["changed"] for line in again.stdout.splitlines() if line.startswith("{")] == [False, False]


def test_follow_answers_with_the_commands_error_and_exit_code(tmp_path: Path, state: Path) -> None:
    command = ["partition", "--dataset-dir", str(tmp_path / "none"), "--out", str(tmp_path / "p"), "--num-parts", "2"]
    _, answer = poll_until_done(state, command)
    assert answer.returncode == 2 and "dglkit partition: error:" in answer.stderr and "not a prepared dataset" in \
        answer.stderr, answer


def running(state: Path, command: list[str]) -> tuple[Path, dict]:
    """Start a command that takes a while and poll until its progress record is there: its directory and record."""
    for _ in range(600):
        assert json.loads(follow(state, command, 0.3).stdout.splitlines()[-1])["follow"] == "running"
        work = next(state.iterdir())
        record = read_json(work / "progress.json")
        if record:
            return work, record
    pytest.fail(f"{command} wrote no progress")


BIG = ["prepare", "--dataset", "synthetic", "--num-nodes", "2000000", "--out"]


@pytest.mark.slow
def test_a_killed_command_is_named_with_its_signal(tmp_path: Path, state: Path) -> None:
    command = [*BIG, str(tmp_path / "data")]
    _, record = running(state, command)
    os.kill(record["pid"], signal.SIGKILL)
    _, answer = poll_until_done(state, command)
    assert answer.returncode == 128 + signal.SIGKILL and "killed by SIGKILL" in answer.stderr, answer


@pytest.mark.slow
def test_a_supervisor_gone_without_an_exit_code_is_an_error_that_says_to_run_again(tmp_path: Path, state: Path) -> None:
    command = [*BIG, str(tmp_path / "data")]
    work, _ = running(state, command)
    os.killpg(json.loads((work / "supervisor.json").read_text())["pid"], signal.SIGKILL)  # as a host restart would
    time.sleep(0.5)
    answer = follow(state, command, 0)
    assert answer.returncode == 2 and "ended without an exit code" in answer.stderr and "run the playbook again" in \
        answer.stderr, answer
    assert not work.exists()  # the next poll starts it over


def test_a_command_that_is_no_json_list_is_refused_before_anything_starts(state: Path) -> None:
    refused = subprocess.run([sys.executable, "-m", "dglkit", "follow", "--state-dir", str(state),
                              "--command", "prepare --out x"], cwd=APP, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "give the dglkit command as a JSON list of strings" in refused.stderr
    assert not state.exists()


@pytest.mark.slow
def test_a_command_outlives_the_directory_of_the_poll_that_started_it(tmp_path: Path, state: Path) -> None:
    """Ansible runs each poll in a temporary directory that it removes when the poll returns: the lean builder's
    METIS child, started later, then came from a removed directory (torch: "MKL FATAL ERROR: Cannot load")."""
    data, parts, module_dir = tmp_path / "data", tmp_path / "parts", tmp_path / "ansible-tmp"
    command = ["prepare", "--dataset", "synthetic", "--num-nodes", "20000", "--out", str(data), "--then",
               "partition", "--dataset-dir", str(data), "--out", str(parts), "--num-parts", "2", "--builder", "lean"]
    module_dir.mkdir()
    first = subprocess.run([sys.executable, "-m", "dglkit", "follow", "--state-dir", str(state), "--wait", "0",
                            "--command", json.dumps(command)], cwd=module_dir, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(APP)})
    assert json.loads(first.stdout.splitlines()[-1])["follow"] == "running", first.stderr
    module_dir.rmdir()
    _, answer = poll_until_done(state, command)
    assert answer.returncode == 0 and json.loads(answer.stdout.splitlines()[-1])["num_parts"] == 2, answer.stderr[-2000:]

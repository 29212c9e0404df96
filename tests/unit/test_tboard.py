"""dglkit.tboard: a job's curves as a TensorBoard event file, read back with TensorBoard's own reader and checked
against metrics.jsonl: tags, steps and values, nothing written twice between the polls and the end, a restart's
redone epochs, and each run of a job id in its own file."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402

from dglkit import tboard  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app"


def epoch(n: int, loss: float) -> dict:
    return {"event": "epoch", "epoch": n, "loss": loss, "train_acc": 0.5 + n / 100, "val_acc": 0.4 + n / 100,
            "epoch_time": 1.5, "seeds_per_s": 1000.0 + n, "eval_time": 0.2, "num_trainers": 2, "time": 1.7e9 + n}


def as_read(values: dict[str, float]) -> dict[str, float]:
    """Values as the event file stores them (float32)."""
    return {tag: struct.unpack("<f", struct.pack("<f", value))[0] for tag, value in values.items()}


def curves(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard's EventAccumulator reads the run folder's event file."""
    [path] = folder.glob("events.out.tfevents.*")
    reader = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    reader.Reload()
    return {tag: [(s.step, s.value) for s in reader.Scalars(tag)] for tag in reader.Tags()[SCALARS]}


def expected(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for tag, value in as_read(tboard.figures(record)).items():
            found.setdefault(tag, []).append((record["epoch"], value))
    return found


def raw_points(folder: Path) -> list[tuple[str, int]]:
    """Every (tag, step) in the file as written, purges not applied."""
    [path] = folder.glob("events.out.tfevents.*")
    return [(value.tag, event.step) for event in EventFileLoader(str(path)).Load() for value in event.summary.value]


def finish(folder: Path) -> dict:
    """The end of a job (roles/dgl_job/tasks/results.yml): the module as a command, on the run folder."""
    proc = subprocess.run([sys.executable, "-m", "dglkit.tboard", "--run-folder", str(folder)], capture_output=True,
                          text=True, env={"PYTHONPATH": str(APP)}, check=True)
    return json.loads(proc.stdout)


def test_a_real_jobs_metrics_read_back_as_its_curves(finished_local_job: Path, tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    metrics = (finished_local_job / "metrics.jsonl").read_text()
    (folder / "metrics.jsonl").write_text(metrics)
    records = tboard.epochs(metrics)
    assert len(records) >= 2
    assert finish(folder)["changed"]
    read = curves(folder)
    assert {"loss", "train_acc", "val_acc", "epoch_time", "seeds_per_s"} <= set(read)
    assert read == expected(records)
    assert finish(folder) == {"changed": False, "events": 0, "file": str(next(folder.glob("events.*")))}


def metrics_file(folder: Path, records: list[dict]) -> None:
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"event": "start"}, *records]))


def test_polls_that_saw_every_epoch_leave_nothing_for_the_end(tmp_path: Path) -> None:
    records = [epoch(n, 1 / (n + 1)) for n in range(4)]
    for seen in (0, 0, 1, 2, 2, 3):  # a poll that found no new epoch answers the same record again
        tboard.record(tmp_path, [records[seen]])
    metrics_file(tmp_path, records)
    assert finish(tmp_path)["changed"] is False
    assert curves(tmp_path) == expected(records)
    written = raw_points(tmp_path)
    assert len(written) == len(set(written)) == 4 * len(tboard.figures(records[0]))


def test_the_end_fills_the_epochs_the_polls_skipped_and_each_reads_once(tmp_path: Path) -> None:
    records = [epoch(n, 1 / (n + 1)) for n in range(5)]
    for seen in (0, 2, 3):  # epochs shorter than dgl_job_progress_seconds: a poll sees the latest only
        tboard.record(tmp_path, [records[seen]])
    metrics_file(tmp_path, records)
    assert finish(tmp_path)["changed"]
    assert curves(tmp_path) == expected(records)


def test_a_restart_from_a_checkpoint_replaces_the_epochs_it_redid(tmp_path: Path) -> None:
    first = [epoch(n, 1 / (n + 1)) for n in range(6)]
    for record in first:
        tboard.record(tmp_path, [record])
    # The next attempt resumed from the checkpoint of epoch 2: metrics.jsonl holds epochs 0-2 from the checkpoint,
    # then its own 3 and 4 (other values); epoch 5 of the first attempt is lost.
    resumed = first[:3] + [epoch(n, 2 / (n + 1)) for n in (3, 4)]
    tboard.record(tmp_path, [resumed[2]])  # the first poll after the restart
    assert curves(tmp_path) == expected(resumed[:3])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in resumed))
    finish(tmp_path)
    assert curves(tmp_path) == expected(resumed)
    assert not finish(tmp_path)["changed"]


def test_a_new_run_of_the_job_id_gets_its_own_file_and_the_earlier_moves_to_history(tmp_path: Path) -> None:
    earlier, new = [epoch(n, 1.0) for n in range(3)], [epoch(n, 0.5) for n in range(2)]
    tboard.record(tmp_path, earlier)
    assert tboard.set_aside(tmp_path, "1") is not None
    tboard.record(tmp_path, new)
    assert curves(tmp_path / "history" / "1") == expected(earlier)
    assert curves(tmp_path) == expected(new)
    assert tboard.set_aside(tmp_path / "empty", "2") is None


def test_records_without_figures_write_no_file(tmp_path: Path) -> None:
    assert tboard.record(tmp_path, [{"event": "epoch", "epoch": 0, "note": "text"}]) == 0
    assert finish(tmp_path)["changed"] is False
    assert not list(tmp_path.glob("events.*"))

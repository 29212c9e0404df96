"""`dglkit report` on metrics written in the trainer's format (docs/design.md)."""

import json
from pathlib import Path

import matplotlib.image
import pytest

EPOCHS = [
    {"event": "epoch", "epoch": 0, "loss": 1.5, "train_acc": 0.40, "val_acc": 0.55, "epoch_time": 4.0,
     "seeds_per_s": 500.0, "num_trainers": 4},
    {"event": "epoch", "epoch": 1, "loss": 0.9, "train_acc": 0.70, "val_acc": 0.81, "epoch_time": 2.0,
     "seeds_per_s": 1000.0, "num_trainers": 4},
    {"event": "epoch", "epoch": 2, "loss": 0.7, "train_acc": 0.78, "val_acc": 0.79, "epoch_time": 3.0,
     "seeds_per_s": 700.0, "num_trainers": 4},
]


def write_job(job: Path, part_config: Path, test: bool = True, tail: str = "") -> None:
    job.mkdir(parents=True, exist_ok=True)
    events = [{"event": "start", "part_config": str(part_config), "num_epochs": 3, "graphbolt": True,
               "num_trainers": 4}, *EPOCHS]
    if test:
        events.append({"event": "test", "test_acc": 0.77, "val_acc": 0.79})
    (job / "metrics.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events) + tail)


def test_report_summary_and_curves(cli, partition_2, tmp_path):
    write_job(tmp_path, partition_2)
    (tmp_path / "result.json").write_text(json.dumps({"test_acc": 0.77, "num_classes": 5}))
    code, result, _ = cli("report", "--job-dir", tmp_path)
    assert code == 0 and result["changed"] and result["best_val_acc"] == 0.81
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["machines"] == 2 and summary["trainers"] == 4 and summary["trainers_per_machine"] == 2
    assert summary["dataset"] == "synthetic (4,000 nodes, {:,} edges)".format(
        json.loads((partition_2.parent / "manifest.json").read_text())["num_edges"])
    assert (summary["epochs"], summary["best_epoch"], summary["final_val_acc"], summary["test_acc"]) == (3, 1, 0.79, 0.77)
    assert summary["mean_epoch_time"] == 2.5 and summary["seeds_per_s"] == 850.0 and summary["complete"]
    assert summary["result"] == {"test_acc": 0.77, "num_classes": 5}
    text = (tmp_path / "summary.txt").read_text()
    assert "2 machines x 2 trainers" in text and "best 81.00% (epoch 1)" in text and "77.00%" in text
    assert len(text.splitlines()) <= 24
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.shape[0] > 200 and image.shape[1] > 800 and image.std() > 0.05
    stamp = (tmp_path / "curves.png").stat().st_mtime_ns
    code, again, _ = cli("report", "--job-dir", tmp_path)
    assert code == 0 and not again["changed"] and (tmp_path / "curves.png").stat().st_mtime_ns == stamp


def test_report_of_an_unfinished_job(cli, partition_1, tmp_path):
    write_job(tmp_path, partition_1, test=False, tail='{"event": "epo')  # killed mid-write
    code, result, _ = cli("report", "--job-dir", tmp_path)
    assert code == 0 and result["test_acc"] is None and result["epochs"] == 3
    assert "job incomplete" in (tmp_path / "summary.txt").read_text()


@pytest.mark.parametrize("content, message", [
    (None, "has no epoch line and no node ran in"),
    ('{"event": "start"}\n', "has no epoch line and no node ran in"),
    ('{"event": "start"}\nnot json\n' + json.dumps(EPOCHS[0]) + "\n", "metrics.jsonl:2 is not JSON: Expecting value"),
    # What the job may write besides: a line that is no object, an epoch record without its number.
    ("[1, 2]\n" + json.dumps(EPOCHS[0]) + "\n", "metrics.jsonl:1 is not a JSON object but [1, 2]"),
    (json.dumps({**EPOCHS[0], "epoch": "1"}) + "\n" + json.dumps(EPOCHS[1]) + "\n",
     'metrics.jsonl:1 is not what the kit writes there: epoch is "1", not an integer from 0'),
])
def test_report_bad_metrics(cli, tmp_path, content, message):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    code, _, err = cli("report", "--job-dir", tmp_path)
    assert code == 2 and message in err and not (tmp_path / "summary.json").exists()


def test_report_of_link_prediction_uses_mrr(cli, partition_2, tmp_path):
    epochs = [{"event": "epoch", "epoch": i, "loss": 0.6 - i / 10, "val_mrr": mrr, "val_hits10": 2 * mrr,
               "epoch_time": 2.0, "seeds_per_s": 900.0, "num_trainers": 2} for i, mrr in enumerate([0.2, 0.35, 0.3])]
    events = [{"event": "start", "part_config": str(partition_2), "num_epochs": 3, "task": "link_prediction",
               "num_trainers": 2}, *epochs,
              {"event": "test", "test_mrr": 0.29, "best_test_mrr": 0.33, "val_mrr": 0.3, "best_val_mrr": 0.35}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    code, result, _ = cli("report", "--job-dir", tmp_path)
    assert code == 0 and (result["best_val_mrr"], result["test_mrr"], result["best_test_mrr"]) == (0.35, 0.29, 0.33)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["task"] == "link_prediction" and summary["metric"] == "mrr" and summary["best_epoch"] == 1
    text = (tmp_path / "summary.txt").read_text()
    assert "val MRR         final 0.3000, best 0.3500 (epoch 1)" in text
    assert "test MRR        0.3300 best validation model, 0.2900 final model" in text
    assert matplotlib.image.imread(tmp_path / "curves.png").shape[0] > 100


def test_summary_inputs_of_the_wrong_type_are_left_out(cli, tmp_path):
    """job.json, and the partition config, manifest and dataset record it names, are the job's to write: a value
    of the wrong type is left out of the summary, never a crash."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "graph.json").write_text(json.dumps({"num_parts": "2", "graph_name": 1}))
    (fake / "manifest.json").write_text(json.dumps({"dataset_dir": str(fake)}))
    (fake / "dataset.json").write_text(json.dumps({"source": "s", "num_nodes": "many", "num_edges": 1}))
    job = tmp_path / "job"
    write_job(job, fake / "graph.json")
    (job / "job.json").write_text(json.dumps({"nodes": "node0", "command": 5, "train_args": [1]}))
    code, _, err = cli("report", "--job-dir", job)
    assert code == 0, err
    summary = json.loads((job / "summary.json").read_text())
    assert (summary["machines"], summary["graph_name"], summary["dataset"]) == (None, None, "graph"), summary
    assert (summary["nodes"], summary["command"], summary["trainers_per_machine"]) == ([], None, None), summary
    assert summary["title"] == "graph: ? machines x ? trainers"


def write_lines(path: Path, events: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(event) + "\n" for event in events))


@pytest.mark.parametrize("named", [True, False], ids=["kit trainer", "program without attempt numbers"])
def test_each_restart_is_paired_with_the_resume_of_the_attempt_after_it(cli, tmp_path, named):
    """Attempt 1 failed before any epoch, so attempt 2 started over; it checkpointed epochs 0-1 and failed; attempt 3
    resumed at epoch 2 and failed before its next checkpoint, so attempt 4 resumed from the same checkpoint, whose
    curves do not hold attempt 3's resume (attempts/3/metrics.jsonl does)."""
    def epoch(n: int, time: float) -> dict:
        return {**EPOCHS[n], "time": time}

    def resume(attempt: int, time: float) -> dict:
        return {"event": "resume", "epoch": 2, "time": time, **({"attempt": attempt} if named else {})}

    (tmp_path / "job.json").write_text(json.dumps({"max_restarts": 3, "nodes": ["n1"]}))
    for attempt, (reason, failed_at) in enumerate([("exited with signal SIGKILL", 1010), ("RuntimeError: boom", 1050),
                                                   ("RuntimeError: again", 1080)], 1):
        write_lines(tmp_path / f"attempts/{attempt}/FAILED", [{"node": "n1", "process": "trainer-0", "reason": reason,
                                                                "attempt": attempt, "started": True, "time": failed_at}])
    write_lines(tmp_path / "attempts/1/metrics.jsonl", [{"event": "start"}])
    write_lines(tmp_path / "attempts/2/metrics.jsonl", [{"event": "start"}, epoch(0, 1030), epoch(1, 1040)])
    write_lines(tmp_path / "attempts/3/metrics.jsonl",
                [{"event": "start"}, epoch(0, 1030), epoch(1, 1040), resume(3, 1060), epoch(2, 1070)])
    write_lines(tmp_path / "metrics.jsonl", [{"event": "start"}, epoch(0, 1030), epoch(1, 1040), resume(4, 1090),
                                             epoch(2, 1100), {"event": "test", "test_acc": 0.7}])
    write_lines(tmp_path / "nodes/n1/status.json", [{"state": "succeeded", "attempt": 4}])
    code, _, err = cli("report", "--job-dir", tmp_path)
    assert code == 0, err
    restarts = [line for line in (tmp_path / "summary.txt").read_text().splitlines() if line.startswith("restart ")]
    assert restarts == [
        "restart         attempt 1 failed on n1 (trainer-0: exited with signal SIGKILL); started over (no checkpoint)",
        "restart         attempt 2 failed on n1 (trainer-0: RuntimeError: boom); resumed at epoch 2, 20 s lost",
        "restart         attempt 3 failed on n1 (trainer-0: RuntimeError: again); resumed at epoch 2, 50 s lost"]


@pytest.mark.parametrize("metrics, progress", [
    (None, "the program finished and wrote no metrics.jsonl"),
    ('{"event": "start"}\n', "the program finished; its metrics.jsonl has no epoch record"),
])
def test_a_program_that_finished_without_epoch_records_is_not_said_to_have_finished_no_epoch(
        cli, tmp_path, metrics, progress):
    (tmp_path / "job.json").write_text(json.dumps({"nodes": ["n1"], "command": "python3 p.py"}))
    write_lines(tmp_path / "nodes/n1/status.json", [{"state": "succeeded", "attempt": 1}])
    if metrics:
        (tmp_path / "metrics.jsonl").write_text(metrics)
    code, _, err = cli("report", "--job-dir", tmp_path)
    text = (tmp_path / "summary.txt").read_text()
    assert code == 0 and f"progress        {progress}\n" in text and "no epoch finished" not in text, text

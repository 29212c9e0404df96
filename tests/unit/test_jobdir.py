"""`dglkit jobdir` (train.yml, storage host, as the job account) on a job directory that an earlier run left and
the job tampered with: the earlier run moves to history/<k>/ whole, and nothing is written through a link."""

import json
import os
from pathlib import Path

CONFIG = {"job_dir": "/srv/dglkit/jobs/j", "nodes": ["node2", "node3"]}
SETTINGS = {"epochs": 5}


def jobdir(cli, job: Path, *extra: str):
    return cli("jobdir", "--job-dir", job, "--nodes", "node2,node3", "--config", json.dumps(CONFIG),
               "--settings", json.dumps(SETTINGS), *extra)


def test_a_new_job_gets_its_directory_and_files(cli, tmp_path: Path):
    job = tmp_path / "jobs" / "j"
    code, result, _ = jobdir(cli, job)
    assert code == 0 and result["history"] is None
    assert sorted(p.name for p in (job / "nodes").iterdir()) == ["node2", "node3"]
    assert json.loads((job / "job.json").read_text()) == CONFIG
    assert json.loads((job / "settings.json").read_text()) == SETTINGS
    assert (job / "job.json").stat().st_mode & 0o777 == 0o644


def test_the_earlier_run_moves_to_history_and_no_link_is_written_through(cli, tmp_path: Path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": 1}\n')
    job = tmp_path / "job"
    (job / "nodes/node2").mkdir(parents=True)
    (job / "nodes/node2/launcher.log").write_text("earlier\n")
    (job / "metrics.jsonl").write_text("{}\n")
    (job / "job.json").symlink_to(outside)  # a kept name the job replaced: moves too
    (job / "settings.json").write_text('{"epochs": 5}\n')
    (job / "history").write_text("not a directory\n")
    code, result, _ = jobdir(cli, job)
    assert code == 0 and result["history"] == str(job / "history" / "1")
    moved = job / "history" / "1"
    assert sorted(p.name for p in moved.iterdir()) == sorted(["nodes", "metrics.jsonl", "job.json", ".history-replaced-"
                                                              + str(os.getpid())])
    assert (moved / "job.json").is_symlink() and outside.read_text() == '{"secret": 1}\n'
    assert not (job / "job.json").is_symlink() and json.loads((job / "job.json").read_text()) == CONFIG
    assert sorted(p.name for p in job.iterdir()) == ["history", "job.json", "nodes", "settings.json"]
    assert not (job / "nodes/node2/launcher.log").exists()


def test_resume_keeps_the_checkpoint_and_a_second_rerun_gets_the_next_history_entry(cli, tmp_path: Path):
    job = tmp_path / "job"
    jobdir(cli, job)
    (job / "checkpoint.pt").write_text("weights\n")
    (job / "checkpoint-sparse").mkdir()
    (job / "checkpoint-sparse" / "3-0.pt").write_text("rows\n")
    _, result, _ = jobdir(cli, job, "--resume", "true")
    assert result["history"] == str(job / "history" / "1") and (job / "checkpoint.pt").is_file()
    assert (job / "checkpoint-sparse" / "3-0.pt").is_file()
    (job / "FAILED").write_text("{}\n")
    _, result, _ = jobdir(cli, job)
    assert result["history"] == str(job / "history" / "2")
    assert sorted(p.name for p in (job / "history" / "2").iterdir()) == ["FAILED", "checkpoint-sparse", "checkpoint.pt",
                                                                         "nodes"]

"""`dglkit pack` (storage host) and roles/dgl_job/files/unpack_results.py (controller) on a job directory that
the job tampered with: links, FIFOs, hard links and directories where its files were. Nothing is read
through them, nothing outside the run folder is written, and what was left out is named."""

import base64
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dglkit.common import read_json
from dglkit.report import run as report_run

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("unpack_results", REPO / "roles/dgl_job/files/unpack_results.py")
unpack_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unpack_results)

SECRET = "root-only marker 4f1c"


@pytest.fixture
def tampered(tmp_path: Path) -> Path:
    """A job directory: regular results, and what a job could plant among them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text(SECRET + "\n")
    (outside / "secret.json").write_text(json.dumps({"secret": SECRET}))
    job = tmp_path / "job"
    (job / "nodes/node2").mkdir(parents=True)
    (job / "result.json").write_text('{"val_acc": 0.9}\n')
    (job / "nodes/node2/launcher.log").write_text("started\n")
    (job / "nodes/node2/unit.log").symlink_to(outside / "secret")
    (job / "settings.json").symlink_to(outside / "secret.json")
    (job / "nodes/node3").symlink_to(outside)  # a directory link: never entered
    os.mkfifo(job / "FAILED")
    (job / "summary.txt").mkdir()  # a directory where a file was
    (job / "summary.txt/inner").write_text("inside a directory\n")
    (job / "model.pt").write_text("weights\n")
    os.link(job / "model.pt", job / "model-copy.pt")
    return job


def test_pack_holds_regular_files_alone_and_names_the_rest(cli, tampered: Path, tmp_path: Path):
    archive = tmp_path / "job.tar"
    code, result, err = cli("pack", "--job-dir", tampered, "--out", archive)
    assert code == 0
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar}
        assert all(m.isreg() and m.uid == 0 and m.uname == "" for m in members.values())
        contents = {name: tar.extractfile(m).read().decode() for name, m in members.items()}
    assert sorted(contents) == ["nodes/node2/launcher.log", "result.json", "summary.txt/inner"]
    assert not any(SECRET in text for text in contents.values())
    assert sorted(result["skipped"]) == ["FAILED (a FIFO)", "model-copy.pt (a hard link: 2 names)",
                                         "model.pt (a hard link: 2 names)", "nodes/node2/unit.log (a symbolic link)",
                                         "nodes/node3 (a symbolic link)", "settings.json (a symbolic link)"]
    assert result["files"] == 3 and "dglkit pack: warning: left out FAILED (a FIFO)" in err


def test_pack_selects_by_relative_path(cli, tampered: Path, tmp_path: Path):
    archive = tmp_path / "job.tar"
    code, result, _ = cli("pack", "--job-dir", tampered, "--out", archive, "--match", "nodes/.*|result.json|FAILED")
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["nodes/node2/launcher.log", "result.json"]
    # Only what the selection names is reported: the kit's trainer has files the run folder never gets.
    assert sorted(result["skipped"]) == ["FAILED (a FIFO)", "nodes/node2/unit.log (a symbolic link)",
                                         "nodes/node3 (a symbolic link)"]


def test_readers_do_not_follow_links_or_block_on_fifos(tampered: Path):
    assert read_json(tampered / "settings.json") is None
    assert read_json(tampered / "FAILED") is None  # a plain open() blocks until a writer comes
    assert read_json(tampered / "result.json") == {"val_acc": 0.9}


def test_report_replaces_planted_outputs_instead_of_writing_through_them(tmp_path: Path):
    job, outside = tmp_path / "job", tmp_path / "outside"
    job.mkdir()
    outside.write_text(SECRET)
    epoch = {"event": "epoch", "epoch": 0, "loss": 1.0, "val_acc": 0.5, "epoch_time": 1.0, "seeds_per_s": 10.0}
    (job / "metrics.jsonl").write_text(json.dumps(epoch) + "\n")
    (job / "summary.json").symlink_to(outside)
    (job / "summary.txt").symlink_to(outside)
    os.mkfifo(job / "curves.png")
    assert report_run(type("Args", (), {"job_dir": job})()) == 0
    assert outside.read_text() == SECRET
    assert all((job / name).is_file() and not (job / name).is_symlink()
               for name in ("summary.json", "summary.txt", "curves.png"))


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = kind, link, 1_700_000_000
    return info


def test_unpack_writes_regular_files_inside_the_run_folder_only(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine\n")
    archive = tmp_path / "results.tar"
    archive.write_bytes(tar_of(
        (member("FAILED"), b'{"node": "node2"}\n'),
        (member("nodes/node2/unit.log"), b"launcher line\n"),
        (member("secret", tarfile.SYMTYPE, "/etc/shadow"), b""),
        (member("hard", tarfile.LNKTYPE, "FAILED"), b""),
        (member("fifo", tarfile.FIFOTYPE), b""),
        (member("../escaped"), b"out\n"),
        (member("/abs"), b"out\n"),
    ))
    run = tmp_path / "runs/job"
    run.mkdir(parents=True)
    # What an older kit's unarchive could have left: links where a directory and a file go.
    (run / "nodes").symlink_to(outside)
    (run / "FAILED").symlink_to(outside / "keep")
    result = unpack_results.unpack(archive.open("rb"), str(run))
    assert result["changed"] and result["files"] == 2
    assert sorted(result["skipped"]) == ["../escaped (a name outside the run folder)",
                                         "/abs (a name outside the run folder)", "fifo (a FIFO)",
                                         "hard (a hard link)", "secret (a symbolic link)"]
    assert (run / "FAILED").read_text() == '{"node": "node2"}\n' and not (run / "FAILED").is_symlink()
    assert not (run / "nodes").is_symlink() and (run / "nodes/node2/unit.log").read_text() == "launcher line\n"
    assert sorted(p.name for p in outside.iterdir()) == ["keep"] and (outside / "keep").read_text() == "mine\n"
    assert not (tmp_path / "runs/escaped").exists() and sorted(p.name for p in run.iterdir()) == ["FAILED", "nodes"]
    # The same archive again changes nothing.
    assert unpack_results.unpack(archive.open("rb"), str(run))["changed"] is False


def test_pack_then_unpack_round_trip(cli, tampered: Path, tmp_path: Path):
    archive, run = tmp_path / "job.tar", tmp_path / "run"
    run.mkdir()
    cli("pack", "--job-dir", tampered, "--out", archive)
    result = unpack_results.unpack(archive.open("rb"), str(run))
    assert result["files"] == 3 and result["skipped"] == []
    assert (run / "result.json").read_text() == '{"val_acc": 0.9}\n'
    assert int((run / "result.json").stat().st_mtime) == int((tampered / "result.json").stat().st_mtime)


def test_pack_summarises_a_started_job_and_puts_a_small_archive_in_its_result(cli, tmp_path: Path):
    job = tmp_path / "job"
    (job / "nodes/node2").mkdir(parents=True)
    epoch = {"event": "epoch", "epoch": 0, "loss": 1.0, "val_acc": 0.5, "epoch_time": 1.0, "seeds_per_s": 10.0}
    (job / "metrics.jsonl").write_text(json.dumps(epoch) + "\n")
    code, result, _ = cli("pack", "--report", "--job-dir", job, "--match", "summary.txt|metrics.jsonl")
    assert code == 0 and result["changed"] and result["reported"] and result["report_error"] is None
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(result["archive_base64"]))) as tar:
        assert sorted(tar.getnames()) == ["metrics.jsonl", "summary.txt"]
    # As train.yml unpacks it: the base64 on the script's stdin.
    unpacked = subprocess.run([sys.executable, REPO / "roles/dgl_job/files/unpack_results.py", tmp_path / "run"],
                              input=result["archive_base64"], capture_output=True, text=True, check=True)
    assert json.loads(unpacked.stdout)["written"] == 2 and (tmp_path / "run/summary.txt").read_text()
    # A larger archive is a file, which train.yml fetches; unpacking removes the fetched copy.
    code, result, _ = cli("pack", "--job-dir", job, "--match", "summary.txt|metrics.jsonl", "--inline-mb", "0")
    archive = Path(result["archive"])
    assert code == 0 and "archive_base64" not in result and archive.is_file()
    unpacked = subprocess.run([sys.executable, REPO / "roles/dgl_job/files/unpack_results.py", tmp_path / "run2",
                               archive], capture_output=True, text=True, check=True)
    assert json.loads(unpacked.stdout)["written"] == 2 and not archive.exists()
    code, result, _ = cli("pack", "--report", "--job-dir", job, "--out", tmp_path / "again.tar")
    assert result["changed"] is False and result["archive"] == str(tmp_path / "again.tar")


def test_pack_does_not_summarise_a_job_that_never_started(cli, tmp_path: Path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.json").write_text("{}\n")
    code, result, _ = cli("pack", "--report", "--job-dir", job, "--out", tmp_path / "job.tar")
    assert code == 0 and result["reported"] is False and not (job / "summary.txt").exists()


def test_pack_still_packs_a_program_whose_metrics_are_in_a_format_of_its_own(cli, tmp_path: Path):
    job = tmp_path / "job"
    (job / "nodes/node2").mkdir(parents=True)
    (job / "metrics.jsonl").write_text('{"event": "epoch", "epoch": 0, "acc": 0.5}\n')
    code, result, _ = cli("pack", "--report", "--job-dir", job, "--out", tmp_path / "job.tar")
    assert code == 0 and result["report_error"] == "KeyError: 'val_acc'" and result["files"] == 1


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def run_of(job: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text(text)


def collect(cli, job: Path, run: Path, tmp_path: Path) -> dict:
    """As train.yml collects a job: `dglkit pack` on the storage host, unpack_results.py on the controller."""
    code, _, err = cli("pack", "--job-dir", job, "--out", tmp_path / "job.tar")
    assert code == 0, err
    return unpack_results.unpack((tmp_path / "job.tar").open("rb"), str(run))


def start_run(cli, job: Path) -> None:
    """train.yml's job directory step: the earlier run moves to history/<k>/."""
    code, _, err = cli("jobdir", "--job-dir", job, "--nodes", "n1", "--config", '{"nodes": ["n1"]}',
                       "--settings", '{"epochs": 3}')
    assert code == 0, err


def test_the_run_folder_holds_the_current_run_and_earlier_runs_under_history_only(cli, tmp_path: Path):
    """A run that failed after a restart and wrote embeddings, then a forced run that succeeded: the run folder is
    the job directory as it now is, the first run under history/1/, nothing of it beside the new results."""
    job, run = tmp_path / "jobs/j", tmp_path / "runs/j"
    start_run(cli, job)
    run_of(job, {"FAILED": '{"attempt": 2}\n', "attempts/1/FAILED": '{"attempt": 1}\n', "emb.pt": "old embeddings\n",
                 "nodes/n1/failure-7.json": '{"process": "trainer-0"}\n', "nodes/n1/launcher.log": "run 1\n"})
    first = collect(cli, job, run, tmp_path)
    assert first["changed"] and first["kept"] is None and files_of(run) == files_of(job)
    start_run(cli, job)
    run_of(job, {"result.json": '{"val_acc": 0.9}\n', "nodes/n1/launcher.log": "run 2, forced\n"})
    second = collect(cli, job, run, tmp_path)
    assert second["changed"] and second["kept"] is None, second
    assert files_of(run) == files_of(job), sorted(files_of(run))
    assert sorted(name for name in files_of(run) if not name.startswith("history/")) == [
        "job.json", "nodes/n1/launcher.log", "result.json", "settings.json"]
    assert (run / "history/1/emb.pt").read_text() == "old embeddings\n" and (run / "history/1/attempts/1/FAILED").is_file()
    # Files that did not change since the first run's unpack were linked, not written again.
    assert second["written"] == 2 and second["files"] == len(files_of(job)), second
    assert sorted(path.name for path in run.parent.iterdir()) == ["j"]
    assert collect(cli, job, run, tmp_path)["changed"] is False


def test_the_controllers_curves_stay_in_the_run_folder_it_replaces(cli, tmp_path: Path):
    """TensorBoard event files are the controller's (app/dglkit/tboard.py), in no archive: a new run's unpack carries
    the live curve and the earlier run's (set aside under history/<k>/) over, and an unchanged job stays unchanged."""
    job, run = tmp_path / "jobs/j", tmp_path / "runs/j"
    start_run(cli, job)
    run_of(job, {"FAILED": '{"attempt": 1}\n'})
    collect(cli, job, run, tmp_path)
    start_run(cli, job)
    run_of(job, {"result.json": '{"val_acc": 0.9}\n'})
    curves = {"events.out.tfevents.2.ctl": b"run 2's curve", "history/1/events.out.tfevents.1.ctl": b"run 1's curve"}
    for name, data in curves.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)
    result = collect(cli, job, run, tmp_path)
    assert result["changed"] and result["kept"] is None, result
    assert {name: files_of(run)[name] for name in curves} == curves
    assert {name for name in files_of(run) if name not in curves} == set(files_of(job))
    assert collect(cli, job, run, tmp_path)["changed"] is False


def test_an_interrupted_unpack_leaves_the_earlier_run_folder_whole(cli, tmp_path: Path):
    job, run = tmp_path / "jobs/j", tmp_path / "runs/j"
    start_run(cli, job)
    run_of(job, {"FAILED": '{"attempt": 1}\n', "nodes/n1/launcher.log": "run 1\n"})
    collect(cli, job, run, tmp_path)
    before = files_of(run)
    start_run(cli, job)
    run_of(job, {"result.json": '{"val_acc": 0.9}\n', "nodes/n1/launcher.log": "run 2 " + "x" * 100_000 + "\n"})
    code, _, _ = cli("pack", "--job-dir", job, "--out", tmp_path / "job.tar")
    whole = (tmp_path / "job.tar").read_bytes()
    # The archive ends half-way through the second run's launcher.log: unpacking fails after writing some files.
    with pytest.raises(tarfile.ReadError):
        unpack_results.unpack(io.BytesIO(whole[:whole.index(b"run 2 ") + 50_000]), str(run))
    assert files_of(run) == before and sorted(path.name for path in run.parent.iterdir()) == ["j"]
    # Killed between moving the earlier run folder aside and putting the new one in place: the next unpack puts
    # the earlier one back first, then replaces it whole.
    run.rename(run.parent / ".j.replaced")
    (run.parent / ".j.unpacking/nodes").mkdir(parents=True)
    result = unpack_results.unpack(io.BytesIO(whole), str(run))
    assert result["changed"] and result["kept"] is None and files_of(run) == files_of(job)
    assert sorted(path.name for path in run.parent.iterdir()) == ["j"]


def test_an_earlier_run_folder_with_files_the_job_no_longer_has_is_kept(cli, tmp_path: Path):
    """The job directory was removed on the storage host and the job ran anew, and the user had added a file to the
    run folder: neither is in the new archive, so the earlier run folder is kept whole beside the new one."""
    job, run = tmp_path / "jobs/j", tmp_path / "runs/j"
    start_run(cli, job)
    run_of(job, {"result.json": '{"val_acc": 0.5}\n'})
    collect(cli, job, run, tmp_path)
    (run / "notes.txt").write_text("mine\n")
    before = files_of(run)
    shutil.rmtree(job)
    start_run(cli, job)
    run_of(job, {"FAILED": '{"attempt": 1}\n'})
    result = collect(cli, job, run, tmp_path)
    assert result["kept"] == str(tmp_path / "runs/j.replaced-1") and files_of(run) == files_of(job)
    assert files_of(tmp_path / "runs/j.replaced-1") == before

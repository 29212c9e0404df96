"""A user program that attacks the kit from inside its job: the kit's own trainer (`dglkit train`, same
arguments), which, after each checkpoint it saves, plants in its job directory what a job could put where the
kit looks afterwards, outside the job's sandbox (tests/e2e/test_tampering.py):

- nodes/<node>/unit.log: a link to /root/pwned-<node> (the unit's log, opened again when the worker boots)
- nodes/<node>/shadow.log, marker.log: links to /etc/shadow and /root/dglkit-marker; fifo.log: a FIFO
- settings.json: a link to /etc/shadow (read by the next train.yml of this job)
- job-link.json: a hard link to job.json
- summary.json: a link to /root/pwned-summary; summary.txt: a FIFO (both written by `dglkit report`)
- history: a link to /root (the next train.yml moves the run there), when there is no history yet
- attempts/70/FAILED: a directory holding a link to /etc/shadow; attempts/80/FAILED: a link to /etc/shadow

Then it pauses --pause seconds after each checkpoint, so that a test can act while it runs.
"""
import os
import sys
import time
from pathlib import Path

from dglkit import checkpoint
from dglkit.__main__ import main


def link(path: Path, target: str) -> None:
    """path becomes a link to target, whatever it was (a file the kit wrote, an open log)."""
    tmp = path.with_name(f".{path.name}.planting")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, path)


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def plant() -> None:
    node_dir = Path(os.environ["DGLKIT_HEARTBEAT_DIR"])
    job_dir = Path(os.environ["DGLKIT_OUTPUT_DIR"])
    link(node_dir / "unit.log", f"/root/pwned-{node_dir.name}")
    link(node_dir / "shadow.log", "/etc/shadow")
    link(node_dir / "marker.log", "/root/dglkit-marker")
    fifo(node_dir / "fifo.log")
    if os.environ.get("RANK") == "0":
        link(job_dir / "settings.json", "/etc/shadow")
        (job_dir / "job-link.json").unlink(missing_ok=True)
        os.link(job_dir / "job.json", job_dir / "job-link.json")
        link(job_dir / "summary.json", "/root/pwned-summary")
        fifo(job_dir / "summary.txt")
        if not os.path.lexists(job_dir / "history"):
            link(job_dir / "history", "/root")
        (job_dir / "attempts/70/FAILED").mkdir(parents=True, exist_ok=True)
        link(job_dir / "attempts/70/FAILED/evil", "/etc/shadow")
        (job_dir / "attempts/80").mkdir(parents=True, exist_ok=True)
        link(job_dir / "attempts/80/FAILED", "/etc/shadow")
    (node_dir / "planted").write_text(f"{time.time()}\n")


def planting(save, pause: float):
    def save_and_plant(*args, **kwargs):
        save(*args, **kwargs)
        plant()
        time.sleep(pause)
    return save_and_plant


if __name__ == "__main__":
    args = sys.argv[1:]
    pause = float(args[args.index("--pause") + 1]) if "--pause" in args else 0.0
    if "--pause" in args:
        del args[args.index("--pause"):args.index("--pause") + 2]
    if os.environ.get("DGL_ROLE") == "client":
        checkpoint.save = planting(checkpoint.save, pause)
    sys.exit(main(["train", *args]))

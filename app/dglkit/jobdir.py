"""`dglkit jobdir`: make a job's directory ready for a run, in one command on the storage host (train.yml).

Nothing of an earlier run is deleted: every entry but job.json, settings.json and history/ (and with --resume
true the checkpoint) moves to history/<k>/ (k = 1, 2, ...), so the new run starts from a clean directory. A
kept name that is not what the kit made there (a link, a FIFO, a file with a second name: the job's doing) moves
like the rest, a history/ that is not a directory first. Then nodes/<node>/ is made for every node and job.json
and settings.json are written, each to a new file renamed over its name: nothing is written through a link. Run
it as the job account, whose directory it is.
"""

import argparse
import json
import os
import stat
from pathlib import Path

from dglkit.common import CHECKPOINT, CHECKPOINT_SPARSE, emit_result, write_json

KEPT = ["job.json", "settings.json", "history"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, type=Path, help="the job directory (made when missing)")
    parser.add_argument("--nodes", required=True, help="comma-separated node names: nodes/<node>/ each")
    parser.add_argument("--resume", choices=["true", "false"], default="false",
                        help="keep the checkpoint in place, so that the run continues from it (dgl_job_resume)")
    parser.add_argument("--config", required=True, help="job.json's content: a JSON object")
    parser.add_argument("--settings", required=True, help="settings.json's content: a JSON object")


def made_by_kit(job_dir: Path, name: str) -> bool:
    st = os.lstat(job_dir / name)
    if name in ("history", CHECKPOINT_SPARSE):
        return stat.S_ISDIR(st.st_mode)
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def archive(job_dir: Path, kept: list[str]) -> str | None:
    """Move the earlier run to history/<k>/; returns that directory, or None when there was nothing to move."""
    moving = sorted(name for name in os.listdir(job_dir) if name not in kept or not made_by_kit(job_dir, name))
    if not moving:
        return None
    history = job_dir / "history"
    if "history" in moving:
        moving[moving.index("history")] = aside = f".history-replaced-{os.getpid()}"
        os.rename(history, job_dir / aside)
    history.mkdir(exist_ok=True)
    target = history / str(1 + len(os.listdir(history)))
    target.mkdir()
    for name in moving:
        os.rename(job_dir / name, target / name)
    return str(target)


def run(args: argparse.Namespace) -> int:
    files = {"job.json": json.loads(args.config), "settings.json": json.loads(args.settings)}
    job_dir: Path = args.job_dir
    job_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    moved = archive(job_dir, KEPT + ([CHECKPOINT, CHECKPOINT_SPARSE] if args.resume == "true" else []))
    for node in filter(None, args.nodes.split(",")):
        (job_dir / "nodes" / node).mkdir(mode=0o755, parents=True, exist_ok=True)
    for name, value in files.items():
        write_json(job_dir / name, value)
    emit_result({"changed": True, "history": moved})
    return 0

"""A job's state across all its nodes, from the shared job directory (status.json, FAILED, STOP,
metrics.jsonl): what `dglkit watch` reports, `dglkit report` summarises and train.yml's pre-flight finds of an
earlier run.

Every file here is the job's to write: they are read through dglkit/jobfiles.py (typed, printable). A node whose
status.json is missing, not a launcher's, or older than `stale_after` seconds (launcher dead, host down) counts as
failed once the wait is over (`final`), when the job has no restarts (with restarts the launchers judge that,
and the job fails here only when every node is silent). Ages are judged on one clock: status.json's
modification time against a file written in the same directory, both stamped by the shared filesystem, so a
node whose clock is off is not mistaken for a silent one.
"""

import os
from pathlib import Path

from dglkit import jobfiles
from dglkit.blame import advice, cause_of, failed_file, repeats, same_error
from dglkit.common import CHECKPOINT, UserError, file_kind, read_text, shared_fs_now

# watch's own states of a node whose launcher says nothing: no status.json, one that is not what a launcher writes
# (the job's doing), one not updated for --stale-after seconds.
SILENT = ("missing", "unreadable", "stale")


def node_states(job_dir: Path, nodes: list[str], stale_after: float) -> dict[str, dict]:
    """name -> {"state", "reason", "attempt"}, with watch's own states for silent nodes (SILENT)."""
    states: dict[str, dict] = {}
    now = shared_fs_now(job_dir)
    for node in nodes:
        path = job_dir / "nodes" / node / "status.json"
        try:
            status = jobfiles.load(path, jobfiles.STATUS, required=("state",))
        except FileNotFoundError:
            states[node] = {"state": "missing", "reason": f"no {path}"}
            continue
        except jobfiles.Unreadable as error:
            states[node] = {"state": "unreadable", "reason": str(error)}
            continue
        states[node] = {"state": status.get("state"), "reason": status.get("reason", ""),
                        "attempt": status.get("attempt", 1)}
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        if status.get("state") in ("starting", "running", "restarting") and age > stale_after:
            states[node].update(state="stale", reason=f"status not updated for {age:.0f} s (launcher or host down?)")
    return states


def latest_progress(job_dir: Path) -> dict | None:
    try:
        lines = read_text(job_dir / "metrics.jsonl").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = jobfiles.event(line)
        except jobfiles.Unreadable:
            continue  # a line being written right now, or the job's doing
        if record.get("event") == "epoch":
            return record
    return None


def snapshot(job_dir: Path, nodes: list[str], stale_after: float, final: bool) -> dict:
    """The job's state: running, restarting (an attempt failed, restarts are left), succeeded, failed or
    stopped (STOP: stop.yml asked). Silent nodes fail it only when `final` (the wait is over)."""
    states = node_states(job_dir, nodes, stale_after)
    config = jobfiles.record(job_dir / "job.json", jobfiles.JOB) or {}
    max_restarts = config.get("max_restarts", 0)
    # A FAILED whose fields are not what a launcher writes still fails the job: its fields count as absent.
    failed = failed_file(job_dir)
    attempt = max([s.get("attempt", 1) for s in states.values()] + [(failed or {}).get("attempt", 1)])
    result = {"state": "running", "nodes": {name: s["state"] for name, s in states.items()}, "attempt": attempt,
              "max_restarts": max_restarts, "progress": latest_progress(job_dir), "failed_node": None, "reason": "",
              "changed": False}
    silent = [name for name, s in states.items() if s["state"] in SILENT]
    bad = [name for name, s in states.items() if s["state"] in ("failed", "stopped")]
    if final and silent and (max_restarts == 0 or len(silent) == len(states)):
        bad += silent
    # A stop during a restart ends the job: the launchers waiting to restart see STOP and stop too.
    restarts_left = failed is not None and failed.get("attempt", 1) <= max_restarts and not repeats(job_dir, failed)
    if failed is not None and not restarts_left:
        result.update(state="failed", **verdict(job_dir, failed, max_restarts))
    elif (job_dir / "STOP").exists():
        result.update(state="stopped", reason="stopped on request (playbooks/stop.yml)")
    elif failed is not None:  # with restarts left: the first branch took the job otherwise
        cause = cause_of(job_dir, failed.get("attempt", 1))
        result.update(state="restarting", failed_node=cause["node"], reason=f"{cause['process']}: {cause['reason']}")
    elif any(s["state"] == "restarting" for s in states.values()):
        result["state"] = "restarting"
    elif bad:
        result.update(state="failed", failed_node=bad[0], reason=f"node {bad[0]}: {states[bad[0]]['reason']}")
    elif all(s["state"] == "succeeded" for s in states.values()):
        result["state"] = "succeeded"
    result["line"] = progress_line(result, config)
    return result


def verdict(job_dir: Path, failed: dict, max_restarts: int) -> dict:
    """Why the job failed: the process that failed first with its traceback (dglkit/blame.py), what stopped
    because of it, the attempts that really ran, whether they all failed alike, and whether it can resume."""
    attempt, started = failed.get("attempt", 1), failed.get("started", True)
    cause = cause_of(job_dir, attempt)
    ran = attempt if started else attempt - 1
    same = same_error(job_dir, failed)
    checkpoint = (job_dir / CHECKPOINT).exists()
    message = f"failed on {cause['node']}: {cause['process']}: {cause['reason']}"
    if cause["where"]:
        message += f" (at {cause['where']})"
    # A process that lost its peer stopped because of the cause; one with an error of its own failed on its own.
    for victims, heading in ((True, "stopped because of it"), (False, "also failed on its own")):
        others = [c for c in cause["consequences"] if c["victim"] is victims]
        if others:
            message += f"; {heading}: " + ", ".join(
                f"{c['node']} {c['process']} ({shorten(c['reason'], 120)})" for c in others)
    if advice(cause):
        message += "; " + advice(cause)
    if same:
        message += f"; failed {ran} times with the same error"
        if attempt <= max_restarts:
            message += ", making no progress in between: not restarting again"
    elif max_restarts:
        message += f"; {ran} attempt{'' if ran == 1 else 's'} ran (at most {max_restarts + 1})"
    if not started:
        message += f"; attempt {attempt} did not start"
    message += ("; -e dgl_job_resume=true continues from the last checkpoint" if checkpoint else
                "; the job wrote no checkpoint.pt, so a new run starts over")
    return {"failed_node": cause["node"], "reason": f"{cause['process']}: {cause['reason']}",
            "process": cause["process"], "log": cause["tail_from"], "log_tail": cause["log_tail"],
            "consequences": cause["consequences"], "attempts_run": ran, "same_error": same,
            "checkpoint": checkpoint, "message": message}


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


# The figures of an epoch event that the progress line shows, where the task reports them.
PROGRESS_FIGURES = ("loss", "train_acc", "val_acc", "val_mrr", "val_hits10")


def progress_line(result: dict, config: dict) -> str:
    """One line for people: state, attempt, latest epoch and each node's state."""
    # train.yml's job.json gives the trainer its settings in "train"; a job.json written for `dglkit launch --config`
    # by hand may pass --num-epochs in train_args instead.
    args = config.get("train_args", [])
    epochs = config.get("train", {}).get("num_epochs") or (
        args[args.index("--num-epochs") + 1] if "--num-epochs" in args[:-1] else "?")
    line = result["state"]
    progress = result["progress"]
    if progress:
        figures = " ".join(f"{name} {progress[name]:.4f}" for name in PROGRESS_FIGURES if name in progress)
        line += f": epoch {progress['epoch'] + 1}/{epochs} {figures}"
        # A user program's epoch events need not carry the kit trainer's timings.
        if "epoch_time" in progress and "seeds_per_s" in progress:
            line += f", {progress['epoch_time']:.1f} s, {progress['seeds_per_s']:.0f} seeds/s"
    if "attempts_run" in result and result["max_restarts"]:
        line += f"; {result['attempts_run']} of at most {result['max_restarts'] + 1} attempts ran"
    elif result["attempt"] > 1 or result["state"] == "restarting":
        line += f"; attempt {result['attempt']} of at most {result['max_restarts'] + 1}"
    if result["reason"] and result["state"] != "succeeded":
        line += f"; {result['failed_node'] or 'job'}: {result['reason']}"
    return line + " [" + ", ".join(f"{name} {state}" for name, state in result["nodes"].items()) + "]"


def earlier_settings(path: Path) -> dict:
    """What the earlier run's settings.json is and its object, read without following a link (the job could
    have replaced it)."""
    try:
        kind = file_kind(os.lstat(path))
    except FileNotFoundError:
        kind = "missing"
    return {"kind": kind, "value": jobfiles.record(path, {})}


def earlier_run(job_dir: Path, nodes: list[str], stale_after: float) -> dict:
    """train.yml's look at an earlier run (`dglkit control ready --job-dir`): state "new" without a job.json, else
    its state now and "settings": {"kind": what settings.json is, "value": its object or null}."""
    if not os.path.lexists(job_dir / "job.json"):
        return {"state": "new"}
    if not nodes:
        raise UserError(f"no nodes to judge {job_dir}'s earlier run by: pass --nodes a,b")
    return {**snapshot(job_dir, nodes, stale_after, final=True), "settings": earlier_settings(job_dir / "settings.json")}

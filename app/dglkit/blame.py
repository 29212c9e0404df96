"""Which process of a failed attempt failed first, and which ones only stopped because of it.

Every failure of an attempt leaves a record in its node's directory (`nodes/<node>/`, moved to
`attempts/<n>/nodes/<node>/` by a restart; a node that was down at the restart keeps its records of attempt n in
`nodes/<node>/`, which is why each record names its attempt):

- `failure-<pid>.json`, written by the process itself when an uncaught exception ends it (jobsite/sitecustomize.py):
  `{"node", "process", "pid", "attempt", "error", "where", "traceback", "time"}`;
- `failed.json`, written by the node's launcher when it fails the attempt: FAILED's fields (a process that
  exited, stalled, a node gone silent, the host shutting down).

Records are ordered by their modification time, which the shared filesystem stamps on one clock (the file
server's), never by the hosts' own clocks. A process that only lost a peer (a connection reset or closed, a broken
pipe, a stop signal) is a consequence whatever its time: the cause is the earliest record that is not such a
victim, or the earliest of all when every record looks like one.
"""

import json
import re
from pathlib import Path
from typing import Any

from dglkit.common import CHECKPOINT, read_json, read_text

# What a process says when another one died under it (gloo, DGL's RPC, sockets) or when it was stopped.
PEER_LOST = re.compile(r"Connection (reset|closed|refused)|Broken pipe|DistConnectError|socket_communicator|"
                       r"ProcessGroupGloo|gloo/transport|SignalException|KeyboardInterrupt|timed out|"
                       r"Socket Timeout|Timed out waiting|exited with signal SIGTERM|exited with signal SIGINT")
TAIL = 20


def records(job_dir: Path, attempt: int) -> list[dict[str, Any]]:
    """Every failure record of the attempt (in nodes/ or attempts/<attempt>/nodes/), a process's own record merged
    with its launcher's, oldest first."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    paths = [path for directory in (job_dir, job_dir / "attempts" / str(attempt)) for name in ("failure-*.json", "failed.json")
             for path in sorted(directory.glob(f"nodes/*/{name}"))]
    for path in paths:
        record = read_json(path)
        if record is None or "process" not in record or record.get("attempt", attempt) != attempt:
            continue
        record = {**record, "node": record.get("node") or path.parent.name, "stamp": path.stat().st_mtime}
        key = (record["node"], record["process"])
        if key in found:
            # The process's own record carries the traceback and the time it raised; the launcher's the exit.
            own, launcher = found[key], record
            found[key] = {**launcher, **own, "exit_code": launcher.get("exit_code"),
                          "stamp": min(own["stamp"], launcher["stamp"])}
        else:
            found[key] = record
    return sorted(found.values(), key=lambda record: record["stamp"])


def is_victim(record: dict[str, Any]) -> bool:
    """The process failed because a peer did (or was stopped): its error is about the connection it lost. One
    killed by a signal other than a stop's was killed from outside: a cause, whatever its log says."""
    if (record.get("exit_code") or 0) < 0 and record["exit_code"] not in (-2, -15):
        return False
    text = " ".join([str(record.get("error") or record.get("reason") or ""), *record.get("traceback", [])[-3:],
                     *([] if record.get("error") else record.get("log_tail", [])[-5:])])
    return bool(PEER_LOST.search(text))


def blame(job_dir: Path, attempt: int) -> dict[str, Any] | None:
    """{"cause": the record of the process that failed first, "consequences": the others}, or None when the
    attempt left no record (then its FAILED file is all there is)."""
    found = records(job_dir, attempt)
    if not found:
        return None
    causes = [record for record in found if not is_victim(record)] or found
    cause = causes[0]
    return {"cause": describe(cause), "consequences": [describe(record) for record in found if record is not cause]}


def describe(record: dict[str, Any]) -> dict[str, Any]:
    """The fields a report shows: node, process, reason (the error), where, log and the end of it (its traceback)."""
    tail = record.get("traceback") or record.get("log_tail") or []
    return {"node": record.get("node"), "process": record.get("process"), "reason": record.get("error") or
            record.get("reason", ""), "where": record.get("where"), "exit_code": record.get("exit_code"),
            "log": record.get("log"), "log_tail": tail[-TAIL:], "victim": is_victim(record),
            "tail_from": f"the traceback of {record.get('process')}" if record.get("traceback") else
            Path(record.get("log") or "its log").name}


def cause_of(job_dir: Path, attempt: int) -> dict[str, Any]:
    """The cause of a failed attempt: by its records, else what its FAILED file says."""
    verdict = blame(job_dir, attempt)
    if verdict:
        return {**verdict["cause"], "consequences": verdict["consequences"]}
    failed = read_json(job_dir / "attempts" / str(attempt) / "FAILED") or read_json(job_dir / "FAILED") or {}
    return {**describe(failed), "consequences": []}


def signature(record: dict[str, Any]) -> tuple:
    """What makes two failures the same: the process, its error and the line that raised it."""
    return record.get("process"), record.get("error") or record.get("reason"), record.get("where")


def progress(job_dir: Path) -> dict[str, Any]:
    """How far the job got: its epoch records and its checkpoint's time (None without one)."""
    try:
        epochs = sum('"event": "epoch"' in line for line in read_text(job_dir / "metrics.jsonl").splitlines())
    except OSError:
        epochs = 0
    try:
        saved = (job_dir / CHECKPOINT).stat().st_mtime
    except OSError:
        saved = None
    return {"epochs": epochs, "checkpoint": saved}


def repeats(job_dir: Path, failed: dict[str, Any]) -> bool:
    """The current attempt (its FAILED record) failed as the one before did, with the same error and no progress
    in between: restarting again cannot help. Every launcher decides from the same two FAILED files."""
    attempt = failed.get("attempt", 1)
    previous = read_json(job_dir / "attempts" / str(attempt - 1) / "FAILED") if attempt > 1 else None
    return bool(previous and failed.get("started", True) and signature(previous) == signature(failed)
                and previous.get("progress") == failed.get("progress") and "progress" in failed)


def restart_refused(job_dir: Path, failed: dict[str, Any], max_restarts: int) -> str | None:
    """Why the attempt that `failed` (its FAILED record) ends is the job's last, or None when another follows.
    An attempt that did not start (a node did not come back within the restart wait) is the last: that node is
    gone, so no later attempt could start either. Every launcher, and `watch`, decide from the same files."""
    attempt = failed.get("attempt", 1)
    if attempt > max_restarts:
        return "no restarts left"
    if not failed.get("started", True):
        return "a node it needs is gone"
    if repeats(job_dir, failed):
        return f"it failed as attempt {attempt - 1} did and made no progress"
    return None


def history(job_dir: Path) -> list[dict[str, Any]]:
    """Each failed attempt that was restarted (attempts/<n>/), oldest first, with its cause."""
    numbers = sorted(int(path.parent.name) for path in job_dir.glob("attempts/*/FAILED") if path.parent.name.isdigit())
    return [{"attempt": n, "started": (read_json(job_dir / "attempts" / str(n) / "FAILED") or {}).get("started", True),
             **cause_of(job_dir, n)} for n in numbers]


def same_error(causes: list[dict[str, Any]]) -> bool:
    """Two or more attempts ran and every one failed with the same error at the same place."""
    return len(causes) > 1 and len({json.dumps(signature(cause)) for cause in causes}) == 1

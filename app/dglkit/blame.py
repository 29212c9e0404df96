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

from dglkit import jobfiles
from dglkit.common import CHECKPOINT, read_text

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
        record = jobfiles.record(path, jobfiles.FAILURE, required=("process",))
        if record is None or record.get("attempt", attempt) != attempt:
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
    killed by a signal other than a stop's was killed from outside: a cause, whatever its log says. SIGABRT is
    a process ending itself on an exception (DGL's RPC aborts when its server's connection goes): its message
    (the launcher's reason) says which."""
    if (record.get("exit_code") or 0) < 0 and record["exit_code"] not in (-2, -6, -15):
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


def failed_file(directory: Path) -> dict[str, Any] | None:
    """The FAILED file in directory (the job's, or a restarted attempt's), its fields typed (dglkit/jobfiles.py)."""
    return jobfiles.record(directory / "FAILED", jobfiles.FAILURE)


def cause_of(job_dir: Path, attempt: int) -> dict[str, Any]:
    """The cause of a failed attempt: by its records, else what its FAILED file says."""
    verdict = blame(job_dir, attempt)
    if verdict:
        return {**verdict["cause"], "consequences": verdict["consequences"]}
    failed = failed_file(job_dir / "attempts" / str(attempt)) or failed_file(job_dir) or {}
    return {**describe(failed), "consequences": []}


def signature(record: dict[str, Any]) -> tuple:
    """What makes two failures the same: the kind of process (a trainer, whichever its rank and node: the same bug
    strikes whichever trainer gets there first), its error and the line that raised it."""
    kind = re.sub(r"-[0-9]+", "", str(record.get("process")))
    return kind, record.get("error") or record.get("reason"), record.get("where")


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
    previous = failed_file(job_dir / "attempts" / str(attempt - 1)) if attempt > 1 else None
    return bool(previous and failed.get("started", True) and alike([previous, failed])
                and previous.get("progress") == failed.get("progress") and "progress" in failed)


def alike(failures: list[dict[str, Any]]) -> bool:
    """Two or more failures (FAILED records: what the launchers restart on) with the same signature."""
    return len(failures) > 1 and len({json.dumps(signature(failure)) for failure in failures}) == 1


def same_error(job_dir: Path, failed: dict[str, Any]) -> bool:
    """Every attempt that started failed as the current one (its FAILED record) did, judged as the launchers judge
    a repeat (`repeats`): on the FAILED records' error, not on which process a report blames."""
    earlier = [failed_file(job_dir / "attempts" / str(n)) or {} for n in range(1, failed.get("attempt", 1))]
    return alike([record for record in [*earlier, failed] if record.get("started", True)])


# A KeyError that DistGraph's node data view raised: the program reads a name the partition does not serve.
NODE_DATA_KEY = re.compile(r"KeyError: '([^']+)'")


def advice(cause: dict[str, Any]) -> str:
    """What to change for a failure that a setting fixes, or ""."""
    key = NODE_DATA_KEY.match(cause.get("reason") or "")
    frames = [cause.get("where") or "", *cause.get("log_tail", [])]
    if key and any("dist_graph.py" in line or "ndata[" in line for line in frames):
        return (f"'{key[1]}' is node data the partition does not have: dgl_job_node_data_names serves a partition's "
                f"names under those your program reads (e.g. {{feat: {key[1]}}})")
    return ""


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
    """Each failed attempt that was restarted (attempts/<n>/), oldest first, with its cause and the time of its
    FAILED record ("failed_time": the launcher's clock)."""
    numbers = sorted(int(path.parent.name) for path in job_dir.glob("attempts/*/FAILED") if path.parent.name.isdigit())
    found = []
    for n in numbers:
        failed = failed_file(job_dir / "attempts" / str(n)) or {}
        found.append({"attempt": n, "started": failed.get("started", True), "failed_time": failed.get("time"),
                      **cause_of(job_dir, n)})
    return found

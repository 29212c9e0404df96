"""Helpers shared by the bench scripts: run-and-measure a command, machine facts, results files, tables."""

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
PYTHON = str(REPO / ".venv" / "bin" / "python")
# The checkout's own app, not whichever checkout the shared venv's editable install points at.
APP_ENV = {**os.environ, "PYTHONPATH": str(REPO / "app")}


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so that `finally` blocks stop the clusters and processes a script started."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def git_commit() -> str:
    """HEAD, with "+dirty" when app/, roles/ or playbooks/ have uncommitted changes (colleagues' work in
    progress changes what is measured)."""
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "app", "roles", "playbooks", "site.yml"],
                           cwd=REPO, capture_output=True, text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """What the figures depend on. Load and free memory say how busy the shared machine was."""
    memory = psutil.virtual_memory()
    versions = {}
    for package in ("dgl", "torch", "ansible-core"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"cpus": os.cpu_count(), "mem_total_gb": round(memory.total / 2**30, 1),
            "mem_available_gb": round(memory.available / 2**30, 1),
            "load": [round(x, 2) for x in os.getloadavg()], "kernel": platform.release(),
            "python": platform.python_version(), **versions}


# "-quick" for smoke runs (--quick): they go to <name>-quick.jsonl and never mix with the real figures.
SUFFIX = ""
# The command line each result records; a script whose arguments name files outside the repository (a local
# copy of DGL's launch.py) records a placeholder for them.
COMMAND = " ".join(shlex.quote(a) for a in sys.argv)


def append(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """Append one result line to bench/results/<name>.jsonl, stamped with date, commit and machine facts."""
    record = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": git_commit(),
              "machine": machine(), "command": COMMAND, **record}
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"{name}{SUFFIX}.jsonl", "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return record


def report(name: str, params: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """append() one run and print it as one line."""
    print(f"{json.dumps(params)}: {json.dumps(figures)}", flush=True)
    return append(name, {"params": params, "figures": figures})


def load(name: str, since: str = "", until: str = "") -> list[dict[str, Any]]:
    """The records of bench/results/<name>.jsonl dated `since` (an ISO date or time prefix) or later, and
    before `until` when given."""
    path = RESULTS / f"{name}{SUFFIX}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [r for r in records if r["date"] >= since and (not until or r["date"] < until)]


def add_common_arguments(parser: argparse.ArgumentParser, quick: str) -> None:
    parser.add_argument("--quick", action="store_true", help=f"smoke run ({quick}); results go to <name>-quick.jsonl")
    parser.add_argument("--table", action="store_true", help="only print the table of the stored results")
    parser.add_argument("--since", default="", help="with --table: results from this date on (e.g. 2026-12-02T15)")
    parser.add_argument("--until", default="", help="with --table: results before this date (e.g. 2026-12-03)")


def parse(parser: argparse.ArgumentParser, name: str,
          print_table: Callable[[list[dict]], None]) -> argparse.Namespace | None:
    """The script's arguments, or None after printing the stored results' table (--table)."""
    global SUFFIX
    args = parser.parse_args()
    if args.quick:
        SUFFIX = "-quick"
    if args.table:
        print_table(load(name, args.since, args.until))
        return None
    exit_on_sigterm()
    return args


def measure(cmd: list[str], env: dict[str, str] | None = None, limit_mb: float | None = None) -> dict[str, Any]:
    """Run cmd to completion: wall time, the child's peak RSS (kernel's ru_maxrss via wait4, so no sample is
    missed), peak RSS of the whole process tree (polled), its last stdout line as JSON, stderr's tail.
    With limit_mb, the tree is killed once it holds more than that: a graph too big must not take the
    shared machine's memory from everyone else."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        load_before = os.getloadavg()[0]
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env or APP_ENV, start_new_session=True)
        tree_peak, over_limit = 0, False
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                tree_peak = max(tree_peak, tree_rss(proc.pid))
                if limit_mb and tree_peak > limit_mb * 2**20 and not over_limit:
                    over_limit = True
                    os.killpg(proc.pid, signal.SIGKILL)
                time.sleep(0.2)
        except BaseException:  # interrupted: take the child's whole session down with us
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        lines = out.read().strip().splitlines()
        stderr = err.read().strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    # CPU seconds of the command and the children it waited for: on a busy shared machine, wall time is
    # mostly waiting; CPU time says what the command costs on an idle one.
    return {"returncode": proc.returncode, "wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024),
            "tree_peak_rss_mb": round(tree_peak / 2**20), "over_limit": over_limit, "result": result,
            "stderr_tail": stderr[-5:], "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2)}


def tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def spread(values: list[float]) -> str:
    """'median (min-max, n)' for a table cell; just the value for one run."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return number(values[0])
    return f"{number(statistics.median(values))} ({number(min(values))}-{number(max(values))}, n={len(values)})"


def number(value: float) -> str:
    """4 significant digits, but never an exponent for large counts."""
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)

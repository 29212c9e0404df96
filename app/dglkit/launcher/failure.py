"""How the launcher words a failure and publishes it: the log's last lines, a hint for a DGL API this DGL lacks,
and the job's FAILED file, which the first failing node writes and every node watches."""

import importlib.metadata
import json
import os
import re
import signal
from pathlib import Path

# A program that fails on a DGL API this DGL lacks (DGL's examples on master use DGL >= 2.2's).
MISSING_DGL_API = re.compile(r"(?:AttributeError: module '(dgl[\w.]*)' has no attribute '(\w+)'"
                             r"|ImportError: cannot import name '(\w+)' from '(dgl[\w.]*)'"
                             r"|ModuleNotFoundError: No module named '(dgl[\w.]*)')")


# What C++ prints of the exception that aborted a process (DGL's RPC, gloo): `what():  [time] file:line: text`.
ABORT_MESSAGE = re.compile(r"^\s*what\(\):\s*(.+?)\s*$", re.M)


def log_tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def abort_message(path: Path) -> str:
    """The message of the C++ exception that aborted a process (SIGABRT), from its log; "" without one. Its
    backtrace and the allocator's banner push it out of the log's last lines."""
    try:
        found = ABORT_MESSAGE.findall(path.read_text(errors="replace"))
    except OSError:
        return ""
    return found[-1] if found else ""


def newer_dgl_hint(tail: list[str]) -> str:
    """What to do when the program failed on a DGL API that the cluster's DGL does not have."""
    found = next(filter(None, map(MISSING_DGL_API.search, reversed(tail))), None)
    if not found:
        return ""
    module, name, imported, source, package = found.groups()
    api = f"{module}.{name}" if module else f"{source}.{imported}" if source else package
    return (f"; the program needs {api}, which the cluster's DGL {importlib.metadata.version('dgl')} does not have "
            "(PyPI's newest for Linux): set dglkit_dgl_spec: dgl-repo for a newer DGL from DGL's wheel repo, or "
            "use this DGL's API")


def describe_exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def publish_failed(job_dir: Path, record: dict, writer: str) -> None:
    """The job's FAILED file, unless another node wrote it first."""
    tmp = job_dir / f".FAILED.{writer}.{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    try:
        # link() is atomic and refuses to overwrite, on NFS too: the first failing node wins.
        os.link(tmp, job_dir / "FAILED")
    except FileExistsError:
        pass
    tmp.unlink()

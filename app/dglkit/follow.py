"""`dglkit follow`: a long dglkit command run in the background on this host, polled by a playbook.

A playbook task that runs `follow --state-dir S --command JSON` in an `until` loop shows a progress line at each
poll (plugins/callback/dglkit.py) instead of waiting in silence for a prepare or a partition of many minutes.
The first poll starts the command detached from the SSH session: a supervisor (`python -m dglkit.follow DIR`) runs
it with its output in S/<hash of the command>/ and DGLKIT_PROGRESS set (dglkit.progress), and records its exit
code. Each poll waits up to --wait seconds: when the command has ended it prints the command's own stdout and
stderr, exits with its code and removes the directory (the answer is the command's, as if it had run in the
task); otherwise it prints `{"follow": "running", "line", "nodes": {host: progress record}, "changed": false}`.
A poll that finds the command of an interrupted playbook still running follows it rather than starting another.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dglkit import progress
from dglkit.common import UserError, emit_result, read_json, write_json

POLL_SECONDS = 0.2
# A directory with no supervisor recorded this long after it was made is a start that died half-way.
START_GRACE_SECONDS = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", required=True, type=Path,
                        help="where the commands run in the background keep their output, one directory each")
    parser.add_argument("--command", required=True,
                        help='the dglkit command as a JSON list of its arguments, e.g. ["prepare", "--out", "D"]')
    parser.add_argument("--wait", type=float, default=5.0,
                        help="seconds to wait for the command to end before answering with its progress (%(default)s)")


def parse_command(text: str) -> list[str]:
    try:
        command = json.loads(text)
    except ValueError:
        command = None
    if not (isinstance(command, list) and command and all(isinstance(arg, str) for arg in command)):
        raise UserError(f"--command {text!r}: give the dglkit command as a JSON list of strings")
    return command


def start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, which tells it from a later process with its pid; None
    when it is gone (a zombie too: killed, not yet reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def start(work: Path, command: list[str]) -> None:
    write_json(work / "command.json", {"command": command})
    # In work/, not in the poll's directory: Ansible runs a module in a temporary directory that it removes when the
    # poll returns, and a process started later from a removed directory fails (torch's MKL cannot load itself).
    supervisor = subprocess.Popen([sys.executable, "-m", "dglkit.follow", str(work)], start_new_session=True, cwd=work,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    write_json(work / "supervisor.json", {"pid": supervisor.pid, "ticks": start_ticks(supervisor.pid)})


def supervisor_alive(work: Path) -> bool:
    record = read_json(work / "supervisor.json")
    if record is None:  # being started, unless the start died
        return time.time() - (work / "command.json").stat().st_mtime < START_GRACE_SECONDS
    return record["ticks"] is not None and start_ticks(record["pid"]) == record["ticks"]


def replay(work: Path, ended: dict[str, Any]) -> int:
    """The command's answer as if it had run in this process, then its directory is gone."""
    sys.stdout.write((work / "stdout").read_text(errors="replace"))
    sys.stdout.flush()
    sys.stderr.write((work / "stderr").read_text(errors="replace"))
    shutil.rmtree(work)
    rc = int(ended["rc"])
    if rc < 0:
        print(f"dglkit follow: the command was killed by {signal.Signals(-rc).name}", file=sys.stderr)
        return 128 - rc
    return rc


def run(args: argparse.Namespace) -> int:
    command = parse_command(args.command)
    work = args.state_dir / hashlib.sha256(json.dumps(command).encode()).hexdigest()[:16]
    args.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        work.mkdir()
        start(work, command)
    except FileExistsError:
        pass  # started by an earlier poll (or an earlier, interrupted playbook): follow it
    deadline = time.monotonic() + args.wait
    while True:
        ended = read_json(work / "exit.json")
        if ended is not None:
            return replay(work, ended)
        if not supervisor_alive(work) and not (work / "exit.json").exists():  # it may have ended since the look
            shutil.rmtree(work, ignore_errors=True)
            raise UserError(f"`dglkit {' '.join(command[:1])}` ended without an exit code (its host restarted, or "
                            "its supervisor was killed): run the playbook again to start it over")
        if time.monotonic() >= deadline:
            record = read_json(work / "progress.json")
            emit_result({"follow": "running", "line": progress.line(record, time.time()),
                         "nodes": {record["host"]: record} if record else {}, "changed": False})
            return 0
        time.sleep(POLL_SECONDS)


def supervise(work: Path) -> None:
    """Run the command with its output in work/ and record how it ended."""
    command = read_json(work / "command.json") or {}
    env = {**os.environ, progress.PROGRESS_ENV: str(work / "progress.json")}
    with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
        rc = subprocess.call([sys.executable, "-m", "dglkit", *command["command"]], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, env=env)
    write_json(work / "exit.json", {"rc": rc})


if __name__ == "__main__":
    supervise(Path(sys.argv[1]))

"""Start and supervise this node's DGL servers and trainers (DGL's tools/launch.py, one node at a time).

Runs on every worker. Runs the job's command (the kit's own trainer, or a user program written for DGL's
launch.py) as `num_servers` DGL servers and `num_trainers` trainers, each with the environment that DGL's
launch.py gives it (a trainer: torchrun's, RANK, WORLD_SIZE, MASTER_ADDR and the rest), then watches them: a
process that fails, a heartbeat that stops, another node whose status went stale, a FAILED file written by
another node's launcher, or a STOP request stop everything this node started. Afterwards no process, listening
port or /dev/shm file of the job is left. Logs, one per process, go to <job dir>/nodes/<node>/:
server-<i>.log, trainer-<rank>.log (each trainer and its samplers) and launcher.log.

The trainers are this launcher's own children, not torchrun's: torchrun would only start them and watch them,
which this launcher does anyway, and it costs a torch import before the first trainer starts and seconds of
teardown after the last one ends (its exit barrier), on every job.

Restarts: after a failed attempt every launcher stops its processes, says so in attempts/<n>/stopped/<node>,
waits until every node has (or --restart-wait passes: a node that did not come back fails the next attempt),
moves its logs to attempts/<n>/nodes/<node>/ and starts attempt n+1, which resumes from the job's checkpoint.
The launchers agree through the shared job directory alone; no controller takes part.
"""

import argparse
import ctypes
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import psutil

from dglkit import kinds, nodedata
from dglkit.blame import is_victim, progress, repeats
from dglkit.common import UserError, check_machine_count, emit_result, read_json, read_partition_config, shared_fs_now, write_json

# Settings and their defaults; job.json uses the same keys, flags override it.
DEFAULTS: dict[str, Any] = {
    "ip_config": None,
    "part_config": None,
    "job_dir": None,
    "node_name": socket.gethostname(),
    "machine_id": None,
    "num_servers": 1,
    "num_trainers": 1,
    "num_samplers": 0,
    "server_threads": 1,
    "trainer_threads": None,
    "master_port": 29500,
    "server_port": 30050,
    "stall_timeout": 120.0,
    "stale_after": 120.0,
    "max_restarts": 0,
    "restart_wait": 300.0,
    "nodes": [],
    "connect_retries": 10,
    "grace": 10.0,
    "local": False,
    "command": "",
    "program_dir": None,
    "python_env": None,
    "node_data_names": {},
    # The kit's trainer's settings (`dglkit train --settings <this file>` reads them; no flag).
    "train": {},
    "train_args": [],
}
# What a command may name in braces; everything else in braces is refused (`${VAR}` is the shell's).
PLACEHOLDERS = ("ip_config", "part_config", "graph_name", "output_dir", "job_dir", "program_dir", "node_name",
                "machine_id", "num_machines", "num_servers", "num_trainers", "num_samplers")
PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")
# The kit's own trainer: the command when job.json names no program (train_args are appended).
BUILTIN_COMMAND = "python3 -m dglkit train --ip-config {ip_config} --part-config {part_config} --out-dir {output_dir}"
# The command's python: the script it runs is found from there (DGL's launch.py puts torchrun after it).
PYTHON_WORD = re.compile(r"(?:^|(?<=[\s;&|(]))((?:[^\s;&|()]*/)?python[0-9.]*)(?=\s|$)")
# A program that fails on a DGL API this DGL lacks (DGL's examples on master use DGL >= 2.2's).
MISSING_DGL_API = re.compile(r"(?:AttributeError: module '(dgl[\w.]*)' has no attribute '(\w+)'"
                             r"|ImportError: cannot import name '(\w+)' from '(dgl[\w.]*)'"
                             r"|ModuleNotFoundError: No module named '(dgl[\w.]*)')")
SHELL_BUILTINS = {"cd", "exec", "export", "set", "eval", ".", "source", "(", "{", "ulimit", "umask", "true"}
# Its sitecustomize makes an uncaught exception end a job's process instead of hanging in DGL's exit.
JOBSITE = Path(__file__).resolve().parent / "jobsite"
STATUS_EVERY = 2.0
# Servers load their partition before they listen, trainers import torch and dgl before they log: on a
# large graph or a busy machine that takes minutes, whatever --stall-timeout says.
START_TIMEOUT = 600.0
POLL = 0.5
LISTEN_POLL = 0.05
# A trainer that exits with an error, or leaves a failure record saying it lost a peer, may only have lost a peer
# that died first, here or on another node; that process's exit shows within a poll, another node's FAILED file
# within that node's poll and the shared filesystem's delay.
PEER_SETTLE = 3.0
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Defaults stay None here so that a flag given on the command line can be told from job.json's value.
    parser.add_argument("--config", help="job.json: keys are this command's long flag names with underscores")
    parser.add_argument("--ip-config", help="DGL ip_config: one '<address> <port>' line per machine")
    parser.add_argument("--part-config", help="partition json; its num_parts must equal ip_config's lines")
    parser.add_argument("--job-dir", help="shared job directory (default: the --config file's directory)")
    parser.add_argument("--node-name", help="name of this node's log directory (default: hostname)")
    parser.add_argument("--machine-id", type=int, help="this node's ip_config line, 0-based (default: the line "
                        "whose address is on a local interface)")
    parser.add_argument("--num-servers", type=int, help="DGL servers on this node (default 1)")
    parser.add_argument("--num-trainers", type=int, help="trainer processes on this node (default 1)")
    parser.add_argument("--num-samplers", type=int, help="sampler processes per trainer (default 0)")
    parser.add_argument("--server-threads", type=int, help="OMP threads per server (default 1)")
    parser.add_argument("--trainer-threads", type=int, help="OMP threads per trainer (default cpus/2/trainers)")
    parser.add_argument("--master-port", type=int, help="torch.distributed port on machine 0 (default 29500)")
    parser.add_argument("--server-port", type=int, help="with --local: first DGL server port (default 30050)")
    parser.add_argument("--stall-timeout", type=float, help="stop the job when a program's heartbeat "
                        "($DGLKIT_HEARTBEAT_DIR/heartbeat-<rank>) has not changed for this many seconds; programs "
                        "that never beat are not judged (default 120)")
    parser.add_argument("--stale-after", type=float, help="stop the job when another node's status.json is older "
                        "than this many seconds by the shared filesystem's clock (default 120)")
    parser.add_argument("--max-restarts", type=int, help="restart the job from its checkpoint this many times "
                        "after a failure (default 0: the first failure ends the job)")
    parser.add_argument("--restart-wait", type=float, help="seconds to wait for every node before a restart "
                        "(default 300)")
    parser.add_argument("--nodes", type=lambda text: text.split(","), help="every node's --node-name, comma "
                        "separated, in ip_config order: enables restarts and the other nodes' liveness checks")
    parser.add_argument("--connect-retries", type=int, help="DGL connect attempts, 3 s apart, before a trainer "
                        "gives up on a server (default 10)")
    parser.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL when stopping (default 10)")
    parser.add_argument("--local", action="store_true", default=None,
                        help="run the whole job on this machine (127.0.0.1, a 1-part partition)")
    parser.add_argument("--command", help="the program's command line as for DGL's launch.py, with {placeholders}: "
                        + ", ".join(f"{{{name}}}" for name in PLACEHOLDERS) + " (default: the kit's trainer)")
    parser.add_argument("--program-dir", help="the program's directory: its script and modules are found there while "
                        "it runs from the job dir, where its relative writes land (default: the job dir)")
    parser.add_argument("--python-env", help="environment whose bin/ leads PATH, so that the command's python is "
                        "its python (default: the launcher's)")
    parser.add_argument("--node-data-names", type=json.loads, help="JSON: the partition's node data under the names "
                        "the program reads, {\"feat\": \"features\"} for every node type or {\"paper\": {\"feat\": "
                        "\"features\"}} for one (DGL's servers rename them as they load them)")
    parser.add_argument("--check", action="store_true", help="run the pre-flight checks only and start nothing")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then `dglkit train` arguments")


def settings(args: argparse.Namespace, config: dict[str, Any] | None = None) -> argparse.Namespace:
    """Flags over job.json (or `config`, its content) over defaults."""
    source = "the job's configuration"
    if config is None and args.config:
        source = args.config
        try:
            config = json.loads(Path(args.config).read_text())
        except (OSError, ValueError) as error:
            raise UserError(f"cannot read --config {args.config}: {error}") from None
        config.setdefault("job_dir", str(Path(args.config).resolve().parent))
    config = config or {}
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise UserError(f"{source}: unknown keys {unknown}; valid keys are {sorted(DEFAULTS)}")
    flags: dict[str, Any] = {key: getattr(args, key, None) for key in DEFAULTS}
    if flags["train_args"] and flags["train_args"][0] == "--":
        flags["train_args"] = flags["train_args"][1:]
    merged = {key: flags[key] if flags[key] not in (None, []) else config.get(key, default)
              for key, default in DEFAULTS.items()}
    if merged["trainer_threads"] is None:
        merged["trainer_threads"] = max((os.cpu_count() or 1) // 2 // max(merged["num_trainers"], 1), 1)
    return argparse.Namespace(**merged)


def read_ip_config(path: Path) -> list[tuple[str, int]]:
    machines = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            socket.inet_aton(fields[0])
            machines.append((fields[0], int(fields[1]) if len(fields) > 1 else DEFAULTS["server_port"]))
        except (OSError, ValueError):
            raise UserError(f"{path} line {number}: expected '<IPv4 address> <port>', got {line!r}") from None
    if not machines:
        raise UserError(f"{path} is empty: it needs one '<address> <port>' line per machine")
    return machines


def local_interfaces() -> dict[str, str]:
    """IPv4 address -> interface name, for every local interface."""
    return {addr.address: name for name, addrs in psutil.net_if_addrs().items()
            for addr in addrs if addr.family == socket.AF_INET}


def check_port_free(address: str, port: int, purpose: str) -> None:
    with socket.socket() as probe:
        # SO_REUSEADDR: a port in TIME_WAIT is reusable by DGL and torch too, so it is not "in use".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            raise UserError(f"port {port} on {address} ({purpose}) is not free: {error.strerror}; stop what "
                            "holds it or choose another port") from None


def preflight(cfg: argparse.Namespace, ahead: bool = False) -> dict:
    """Every check that can fail before anything starts; returns the derived layout of the job. `ahead`: train.yml's
    pre-flight, before it makes the job directory for this run (an earlier run's FAILED and STOP then move to
    history/) and with the ports judged by `dglkit control ready` (which knows whether the job runs already)."""
    if not cfg.job_dir:
        raise UserError("no job directory: pass --job-dir or --config <job dir>/job.json")
    if not cfg.part_config:
        raise UserError("no partition: pass --part-config <partition dir>/<graph>.json")
    job_dir = Path(cfg.job_dir).resolve()
    failed = read_json(job_dir / "FAILED")
    # A FAILED with restarts left is a restart in progress, which a launcher started late (a host back from a
    # reboot) joins.
    if not ahead and (job_dir / "FAILED").exists() and ((failed or {}).get("attempt", 1) > cfg.max_restarts
                                                        or repeats(job_dir, failed or {})):
        raise UserError(f"{job_dir}/FAILED exists (node {(failed or {}).get('node')}): this job has failed; "
                        "start a new job directory")
    if not ahead and (job_dir / "STOP").exists():
        raise UserError(f"{job_dir}/STOP exists: this job was stopped; start a new job directory")
    if cfg.local:
        # Written by run() once every check has passed.
        ip_config = job_dir / "ip_config.txt"
        machines = [("127.0.0.1", cfg.server_port)]
    elif not cfg.ip_config:
        raise UserError("no ip_config: pass --ip-config (or --local to run on this machine alone)")
    else:
        ip_config = Path(cfg.ip_config).resolve()
        if not ip_config.is_file():
            raise UserError(f"ip_config {ip_config} not found")
        machines = read_ip_config(ip_config)
    part_config = Path(cfg.part_config).resolve()
    partition = read_partition_config(part_config)
    check_machine_count(part_config, partition["num_parts"], ip_config, len(machines))
    # Whether the graph is heterogeneous only the partition tells (a files dataset): refused here, on every
    # node, before anything starts.
    task_error = kinds.task_error(cfg.train["task"], partition, part_config) if "task" in cfg.train else None
    if task_error and not cfg.command:
        raise UserError(task_error)

    interfaces = local_interfaces()
    if cfg.machine_id is not None:
        if not 0 <= cfg.machine_id < len(machines):
            raise UserError(f"--machine-id {cfg.machine_id} is not a line of {ip_config} (0..{len(machines) - 1})")
        machine_id = cfg.machine_id
    else:
        local_lines = [i for i, (address, _) in enumerate(machines) if address in interfaces]
        if not local_lines:
            raise UserError(f"none of this node's addresses {sorted(interfaces)} is in {ip_config}: run on a "
                            "listed machine or pass --machine-id")
        machine_id = local_lines[0]
    address, port = machines[machine_id]
    for s in range(cfg.num_servers if not ahead else 0):
        check_port_free(address, port + s, f"DGL server {s}")
    if machine_id == 0 and not ahead:
        check_port_free(address, cfg.master_port, "torch.distributed master port")
    for key in ("num_servers", "num_trainers", "grace", "stall_timeout", "connect_retries", "stale_after",
                "restart_wait"):
        if getattr(cfg, key) <= 0:
            raise UserError(f"--{key.replace('_', '-')} must be positive, got {getattr(cfg, key)}")
    if cfg.max_restarts < 0:
        raise UserError(f"--max-restarts must be 0 or more, got {cfg.max_restarts}")
    if cfg.nodes and (len(cfg.nodes) != len(machines) or cfg.node_name not in cfg.nodes):
        raise UserError(f"--nodes {','.join(cfg.nodes)}: give one name per ip_config line ({len(machines)}), "
                        f"including this node's {cfg.node_name}")
    program_dir = Path(cfg.program_dir).resolve() if cfg.program_dir else job_dir
    if not program_dir.is_dir() and (cfg.program_dir or not ahead):
        raise UserError(f"program directory {program_dir} not found on {cfg.node_name}: ship the program first")
    served_names = nodedata.served_names(part_config, cfg.node_data_names)
    bin_dir = Path(cfg.python_env or sys.prefix) / "bin"
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    values = {"ip_config": ip_config, "part_config": part_config, "graph_name": graph_name(part_config),
              "output_dir": job_dir, "job_dir": job_dir, "program_dir": program_dir, "node_name": cfg.node_name,
              "machine_id": machine_id, "num_machines": len(machines), "num_servers": cfg.num_servers,
              "num_trainers": cfg.num_trainers, "num_samplers": cfg.num_samplers}
    template = cfg.command or " ".join([BUILTIN_COMMAND, *map(shlex.quote, cfg.train_args)])
    command = in_program_dir(expand(template, values), program_dir)
    check_executables(command, program_dir, path, cfg.node_name)
    return {"job_dir": job_dir, "ip_config": ip_config, "part_config": part_config, "machines": machines,
            "machine_id": machine_id, "address": address, "port": port, "command": command, "cwd": job_dir,
            "program_dir": program_dir, "served_names": served_names, "path": path,
            "ifname": interfaces.get(address, "lo"), "node_dir": job_dir / "nodes" / cfg.node_name}


def check_ahead(config: dict[str, Any], node_name: str) -> dict[str, Any]:
    """`--check` on job.json's content before train.yml writes the file (`dglkit control ready`: one round trip
    fewer). {"checked": false} while the partition is still to be made: train.yml then runs `--check` after it."""
    cfg = settings(argparse.Namespace(config=None, node_name=node_name), config)
    if not cfg.part_config or not Path(cfg.part_config).is_file():
        return {"checked": False, "error": None}
    try:
        preflight(cfg, ahead=True)
    except UserError as error:
        return {"checked": True, "error": str(error)}
    return {"checked": True, "error": None}


def graph_name(part_config: Path) -> str:
    return str(read_partition_config(part_config)["graph_name"])


def expand(command: str, values: dict) -> str:
    """The command with each {placeholder} replaced by its shell-quoted value."""
    unknown = sorted({name for name in PLACEHOLDER.findall(command) if name not in values})
    if unknown:
        raise UserError(f"unknown placeholder(s) {', '.join('{' + name + '}' for name in unknown)} in the command; "
                        f"known: {', '.join('{' + name + '}' for name in PLACEHOLDERS)} (write ${{NAME}} for a "
                        "shell variable)")
    return PLACEHOLDER.sub(lambda found: shlex.quote(str(values[found.group(1)])), command)


def python_word(command: str) -> re.Match:
    found = PYTHON_WORD.search(command)
    if not found:
        raise UserError(f"the command {command!r} starts no python: as for DGL's launch.py, which runs trainers as "
                        "`python -m torch.distributed.run <your script>`, the command must run python")
    return found


def in_program_dir(command: str, program_dir: Path) -> str:
    """The command with the script its python runs, and a first program or python given as a relative path
    (./run.sh), named by their path in the program directory: the command runs from the job directory (as
    launch.py runs it from its --workspace), so that the program's relative writes land in the job's output."""
    python = python_word(command)
    paths = {python.span(1)}
    first = re.match(r"\s*(\S+)", command)
    if first and first.start(1) < python.start(1):
        paths.add(first.span(1))
    script = re.compile(r"(?<=\s)(?!-)\S+").search(command, python.end())
    words = [span for span in paths if "/" in command[slice(*span)]]
    if script and not any(option.startswith(("-m", "-c")) for option in command[python.end():script.start()].split()):
        words.append(script.span())
    for start, end in sorted(words, reverse=True):
        word = command[start:end]
        if re.fullmatch(r"[\w.+-]+(?:/[\w.+-]+)*", word) and (program_dir / word).is_file():
            command = command[:start] + shlex.quote(str(program_dir / word)) + command[end:]
    return command


def check_executables(command: str, cwd: Path, path: str, node: str) -> None:
    """The command's first program and its python must exist on this node, and so must the script that python
    runs when the command starts with it."""
    try:
        words = [word for word in shlex.split(command) if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word)]
    except ValueError as error:
        raise UserError(f"the command {command!r} is not a valid shell command line: {error}") from None
    python = python_word(command).group(1)
    for program in {words[0], python} - SHELL_BUILTINS:
        if not (shutil.which(program, path=path) if "/" not in program else os.access(cwd / program, os.X_OK)):
            raise UserError(f"`{program}` of the command is not an executable on {node} (looked in {path} from "
                            f"{cwd}): install it or fix the command")
    if words[0] != python:
        return
    if not any(word in ("-m", "-c") or not word.startswith("-") for word in words[1:]):
        raise UserError(f"the command {command!r} gives python no script: name the script or module it runs")
    script = next((word for word in words[1:] if not word.startswith("-")), None)
    if script and script.endswith(".py") and "-m" not in words[1:words.index(script)] and not (cwd / script).is_file():
        raise UserError(f"{python} would run {script}, which is not in {cwd} on {node}: fix the command or the "
                        "program directory")


class Launcher:
    """This node's processes, their state and the orderly stop of all of them."""

    def __init__(self, cfg: argparse.Namespace, job: dict):
        self.cfg, self.job = cfg, job
        self.node_dir: Path = job["node_dir"]
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.pgids: set[int] = set()
        self.state, self.reason = "starting", ""
        self.status_written = 0.0
        self.signal_received = 0
        self.shm_before = set(os.listdir("/dev/shm"))
        self.log_file: TextIO | None = None
        self.nodes: list[str] = cfg.nodes or [cfg.node_name]
        self.attempt = current_attempt(job["job_dir"])
        self.peers_checked = 0.0
        self.attempt_started = time.monotonic()
        # Whether the current attempt started its processes (one that waited for a node in vain did not).
        self.started = True
        self.listening = False
        self.victim_seen = 0.0

    def run(self) -> None:
        """Attempts until one succeeds, a stop is requested, this host shuts down or the restarts run out."""
        status = read_json(self.node_dir / "status.json") or {}
        if status.get("state") == "succeeded":
            self.state = "succeeded"  # started again after the end (by hand, or at boot): nothing to do
            return
        if self.rejoined_after_crash():
            self.fail("launcher", None, f"this node's launcher started again during attempt {self.attempt} "
                      "(host rebooted or launcher killed)", self.node_dir / "launcher.log")
        while True:
            if self.failed_record() is None:
                self.run_attempt()
                if self.state in ("succeeded", "stopped") or self.signal_received:
                    return
            failed = self.failed_record() or {}
            reason = f"node {failed.get('node')}: {failed.get('process')}: {failed.get('reason')}"
            if self.attempt > self.cfg.max_restarts:
                self.set_state("failed", reason if self.cfg.max_restarts == 0 else
                               f"attempt {self.attempt} failed ({reason}); no restarts left")
                return
            if repeats(self.job["job_dir"], failed):
                self.set_state("failed", f"attempt {self.attempt} failed as attempt {self.attempt - 1} did ({reason}) "
                               "and made no progress; not restarting")
                return
            self.set_state("restarting", f"attempt {self.attempt} failed ({reason})")
            missing = self.wait_for_peers()
            if self.state == "stopped":
                return
            self.archive_attempt()
            self.attempt += 1
            self.started = False
            if missing:
                self.fail("node", None, f"node(s) {', '.join(missing)} did not come back within "
                          f"{self.cfg.restart_wait:.0f} s", self.node_dir / "launcher.log", node=missing[0])

    def run_attempt(self) -> None:
        self.procs, self.logs, self.pgids = {}, {}, set()
        self.started, self.victim_seen, self.listening, self.servers_started = True, 0.0, False, time.time()
        self.attempt_started = time.monotonic()
        self.set_state("starting")
        self.say(f"attempt {self.attempt} of at most {self.cfg.max_restarts + 1}")
        try:
            self.start_all()
            self.supervise()
        finally:
            self.stop_all()

    def rejoined_after_crash(self) -> bool:
        """This node's status says it was in the middle of the current attempt: its launcher died with it."""
        status = read_json(self.node_dir / "status.json") or {}
        return (status.get("attempt") == self.attempt and status.get("state") in ("starting", "running")
                and self.failed_record() is None)

    def wait_for_peers(self) -> list[str]:
        """Barrier before the next attempt: every node has stopped its processes. Returns the nodes that did not
        say so within --restart-wait (down, or not back yet)."""
        attempt_dir = self.job["job_dir"] / "attempts" / str(self.attempt)
        stopped = attempt_dir / "stopped"
        stopped.mkdir(parents=True, exist_ok=True)
        (stopped / self.cfg.node_name).touch()
        deadline = time.monotonic() + self.cfg.restart_wait
        while True:
            missing = sorted(set(self.nodes) - {path.name for path in stopped.iterdir()})
            # attempts/<n>/FAILED: a faster node passed the barrier already and moved the FAILED file there.
            if not missing or (attempt_dir / "FAILED").exists():
                return []
            if (self.job["job_dir"] / "STOP").exists() or self.signal_received:
                self.set_state("stopped", "stop requested while waiting to restart")
                return []
            if time.monotonic() > deadline:
                return missing
            self.write_status()
            time.sleep(POLL)

    def archive_attempt(self) -> None:
        """Move this node's logs of the failed attempt, and the attempt's FAILED file, to attempts/<n>/."""
        job_dir = self.job["job_dir"]
        attempt_dir = job_dir / "attempts" / str(self.attempt)
        archive = attempt_dir / "nodes" / self.cfg.node_name
        archive.mkdir(parents=True, exist_ok=True)
        if self.log_file:
            self.log_file.close()
        for path in self.node_dir.iterdir():
            # unit.log is systemd's for the unit's whole life; status.json always tells the current state.
            if path.name not in ("status.json", "unit.log"):
                os.replace(path, archive / path.name)
        self.log_file = open(self.node_dir / "launcher.log", "a")
        if self.failed_record() is not None:
            if (job_dir / "metrics.jsonl").exists():
                shutil.copy(job_dir / "metrics.jsonl", attempt_dir / ".metrics.jsonl.tmp")
                os.replace(attempt_dir / ".metrics.jsonl.tmp", attempt_dir / "metrics.jsonl")
            try:
                os.replace(job_dir / "FAILED", attempt_dir / "FAILED")
            except FileNotFoundError:
                pass  # another node moved it

    def say(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} launch[{self.cfg.node_name}]: {message}"
        print(line, file=sys.stderr, flush=True)
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def start(self, name: str, command: str, env: dict[str, str], log: Path) -> None:
        # A plain `python ...` replaces the shell, so that it gets the death signal below itself.
        if PYTHON_WORD.match(command) and not re.search(r"[;&|<>()`$]", command):
            command = f"exec {command}"
        with open(log, "ab") as out:
            # Own process group (stopped by PGID); SIGTERM if the launcher itself dies.
            self.procs[name] = subprocess.Popen(
                ["/bin/sh", "-c", command], env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.job["cwd"], start_new_session=True, preexec_fn=die_with_parent)
        self.logs[name] = log
        self.pgids.add(self.procs[name].pid)
        self.say(f"started {name} (pid {self.procs[name].pid}), log {log}")

    def start_all(self) -> None:
        """The command as DGL servers, then as the trainers, each with launch.py's environment."""
        cfg, job = self.cfg, self.job
        num_machines = len(job["machines"])
        # The program directory for `python -m its.module` (a script's own directory is on sys.path anyway).
        pythonpath = os.pathsep.join(filter(None, [str(JOBSITE), str(job["program_dir"]) if cfg.program_dir else "",
                                                   os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PATH=job["path"], PYTHONPATH=pythonpath, DGLBACKEND="pytorch",
                   PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME=job["ifname"], DGL_DIST_MAX_TRY_TIMES=str(cfg.connect_retries),
                   DGL_NUM_CLIENT=str(cfg.num_trainers * (1 + cfg.num_samplers) * num_machines),
                   DGL_CONF_PATH=str(job["part_config"]), DGL_IP_CONFIG=str(job["ip_config"]),
                   DGL_NUM_SERVER=str(cfg.num_servers), DGL_NUM_SAMPLER=str(cfg.num_samplers),
                   DGL_GRAPH_FORMAT="csc", DGLKIT_OUTPUT_DIR=str(job["job_dir"]),
                   DGLKIT_FAILURE_DIR=str(self.node_dir), DGLKIT_NODE=cfg.node_name, DGLKIT_ATTEMPT=str(self.attempt))
        for s in range(cfg.num_servers):
            server_env = dict(env, DGL_ROLE="server", DGL_SERVER_ID=str(job["machine_id"] * cfg.num_servers + s),
                              DGL_KEEP_ALIVE="0", OMP_NUM_THREADS=str(cfg.server_threads), DGLKIT_PROCESS=f"server-{s}")
            if job["served_names"]:
                server_env[nodedata.ENV] = json.dumps(job["served_names"])
            self.start(f"server-{s}", job["command"], server_env, self.node_dir / f"server-{s}.log")
        # Trainers start with the servers, as DGL's launch.py starts them: their imports overlap the servers'
        # start-up, and they connect once every node's servers listen (jobsite/; DGL retries, 3 s apart, after).
        for local_rank in range(cfg.num_trainers):
            rank = job["machine_id"] * cfg.num_trainers + local_rank
            self.start(f"trainer-{rank}", job["command"], dict(
                env, **trainer_environment(rank, local_rank, cfg.num_trainers, num_machines, job["machine_id"],
                                           job["machines"][0][0], cfg.master_port),
                DGL_DIST_MODE="distributed", DGL_ROLE="client", DGL_GROUP_ID="0", DGLKIT_PROCESS=f"trainer-{rank}",
                DGLKIT_SERVER_STATUS=",".join(str(self.node_dir.parent / node / "status.json") for node in self.nodes),
                OMP_NUM_THREADS=str(cfg.trainer_threads), DGLKIT_HEARTBEAT_DIR=str(self.node_dir)),
                self.node_dir / f"trainer-{rank}.log")
        self.servers_started = time.time()
        self.set_state("running")

    def servers_listening(self) -> bool:
        """Whether this node's servers listen; fails the attempt for a server that ended before it listened or
        servers that did not listen within START_TIMEOUT. Checked until they do."""
        if self.listening:
            return True
        ports = {self.job["port"] + s for s in range(self.cfg.num_servers)}
        servers = {name: proc for name, proc in self.procs.items() if name.startswith("server-")}
        listening = {conn.laddr.port for proc in servers.values() if proc.poll() is None
                     for conn in safe_connections(proc.pid) if conn.status == psutil.CONN_LISTEN}
        if ports <= listening:
            self.listening = True
            self.write_status(force=True)  # the trainers connect once every node's file says so (jobsite/)
            return True
        ended = [name for name, proc in servers.items() if proc.poll() == 0]
        if ended:
            # A server that is done before it listens never ran DGL's initialize() (a command that is
            # not a DGL program, a script that returns early).
            self.fail(ended[0], 0, "exited before it listened on its port", self.logs[ended[0]])
        elif time.time() > self.servers_started + START_TIMEOUT:
            self.fail("servers", None, f"servers did not listen on ports {sorted(ports)} within "
                      f"{START_TIMEOUT:.0f} s", self.logs["server-0"])
        return False

    def supervise(self) -> None:
        heartbeats = HeartbeatWatch(self.node_dir)
        while self.state == "running":
            self.track_descendants()
            if self.check_processes() or self.check_outside():
                return
            if not self.servers_listening() and self.state != "running":
                return
            if all(proc.poll() == 0 for name, proc in self.procs.items() if name.startswith("trainer-")):
                self.wait_for_servers_exit()
                return
            stalled = heartbeats.stalled(self.cfg.stall_timeout)
            if stalled:
                rank = stalled.name.removeprefix("heartbeat-")
                log = self.node_dir / f"trainer-{rank}.log"
                self.fail(f"trainer-{rank}", None, f"stalled: its heartbeat did not change for "
                          f"{self.cfg.stall_timeout:.0f} s", log)
                return
            self.write_status()
            # The trainers wait for this node's servers to listen: see that soon.
            time.sleep(POLL if self.listening else LISTEN_POLL)

    def wait_for_servers_exit(self) -> None:
        """Servers exit by themselves once every trainer of the job is done; other nodes may still finish."""
        self.say("trainers finished; waiting for the servers to exit")
        deadline = time.time() + self.cfg.stall_timeout
        while time.time() < deadline:
            if self.check_processes() or self.check_outside():
                return
            if all(proc.poll() is not None for proc in self.procs.values()):
                self.set_state("succeeded")
                return
            self.write_status()
            time.sleep(POLL)
        self.set_state("succeeded", f"servers did not exit {self.cfg.stall_timeout:.0f} s after the trainers "
                       "finished; stopped them")

    def check_processes(self) -> bool:
        """A local process that failed: fail the job. Of several, one killed by a signal: the trainers that lost it
        as a peer exit with an error of their own, sometimes first."""
        if self.check_failure_records():
            return True
        failed = [(name, code) for name, code in ((name, proc.poll()) for name, proc in self.procs.items())
                  if code not in (None, 0)]
        if not failed:
            return False
        name, code = min(failed, key=lambda failure: failure[1] > 0)
        if name.startswith("trainer-") and code > 0 and self.peer_failed_first():
            return True
        self.fail(name, code, f"exited with {describe_exit(code)}", self.logs[name])
        return True

    def check_failure_records(self) -> bool:
        """A process of this node that left a failure record (an uncaught exception, jobsite/sitecustomize.py) fails
        the attempt at once, naming it with its traceback, even when its parent would wait for it (a sampler)."""
        found = [record for record in map(read_json, self.node_dir.glob("failure-*.json")) if record and "process" in record]
        # A process that only lost a peer raises too, often first: the cause may be a process of this node that
        # was killed (its exit shows within a poll) or another node's, so a victim's record
        # counts only once PEER_SETTLE seconds have passed without either.
        for record in sorted(found, key=lambda record: (is_victim(record), record.get("time", 0))):
            if is_victim(record):
                self.victim_seen = self.victim_seen or time.monotonic()
                if time.monotonic() - self.victim_seen < PEER_SETTLE:
                    return False
            name = record["process"]
            rank = name.removeprefix("trainer-").removesuffix("-sampler")
            log = self.logs.get(name, self.node_dir / f"trainer-{rank}.log")
            self.fail(name, None, record.get("error", ""), log,
                      tail=record.get("traceback", [])[-12:], where=record.get("where"))
            return True
        return False

    def peer_failed_first(self) -> bool:
        """Another node's failure of this attempt, recorded within PEER_SETTLE seconds (this node then stops as
        for any other node's failure and leaves the record to it)."""
        deadline = time.monotonic() + (PEER_SETTLE if len(self.nodes) > 1 else 0)
        while time.monotonic() < deadline:
            if self.failed_record() is not None:
                return self.check_outside()
            time.sleep(POLL)
        return False

    def check_outside(self) -> bool:
        """A stop request (STOP file, or a signal), another node's FAILED file or another node gone silent."""
        job_dir = self.job["job_dir"]
        if (job_dir / "STOP").exists():
            self.set_state("stopped", "stop requested (STOP)")
            return True
        if self.signal_received and self.cfg.max_restarts == 0:
            self.set_state("stopped", f"received {signal.Signals(self.signal_received).name}")
            return True
        if self.signal_received:
            # systemd stops the unit this way when the host shuts down: the other nodes restart without us,
            # and this node rejoins when it is back.
            self.fail("launcher", None, f"received {signal.Signals(self.signal_received).name} without a stop "
                      "request (host shutting down?)", self.node_dir / "launcher.log")
            return True
        failed = self.failed_record()
        if failed is not None:
            self.set_state("failed", f"node {failed.get('node')} failed ({failed.get('process')}: "
                           f"{failed.get('reason')}); stopped this node's processes")
            return True
        stale = self.stale_peer()
        if stale:
            self.fail("node", None, stale[1], self.node_dir / "launcher.log", node=stale[0])
            return True
        return False

    def stale_peer(self) -> tuple[str, str] | None:
        """Another node whose status.json is older than --stale-after by the shared filesystem's clock."""
        if len(self.nodes) < 2 or time.monotonic() - self.peers_checked < STATUS_EVERY:
            return None
        self.peers_checked = time.monotonic()
        now = shared_fs_now(self.job["job_dir"])
        for node in self.nodes:
            if node == self.cfg.node_name:
                continue
            path = self.job["job_dir"] / "nodes" / node / "status.json"
            if (read_json(path) or {}).get("state") == "succeeded":
                continue  # done and gone: its launcher no longer refreshes the file
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                age = time.monotonic() - self.attempt_started
            if age > self.cfg.stale_after:
                return node, f"node {node} silent: its status.json is {age:.0f} s old (launcher or host down?)"
        return None

    def failed_record(self) -> dict | None:
        """The job's FAILED file when it is about this attempt."""
        failed = read_json(self.job["job_dir"] / "FAILED")
        return failed if failed is not None and failed.get("attempt", 1) == self.attempt else None

    def fail(self, process: str, code: int | None, reason: str, log: Path, node: str | None = None,
             tail: list[str] | None = None, where: str | None = None) -> None:
        """Record the failure in this node's failed.json and, if no other node was first, in the job's FAILED
        file (which stops every node)."""
        tail = log_tail(log) if tail is None else tail
        reason += newer_dgl_hint(tail)
        self.say(f"FAILED: {process}: {reason}; last lines of {log}:\n    " + "\n    ".join(tail))
        record = {"node": node or self.cfg.node_name, "process": process, "exit_code": code, "reason": reason,
                  "where": where, "log": str(log), "log_tail": tail, "time": time.time(), "attempt": self.attempt,
                  "started": self.started, "progress": progress(self.job["job_dir"])}
        write_json(self.node_dir / "failed.json", record)
        tmp = self.job["job_dir"] / f".FAILED.{self.cfg.node_name}.{os.getpid()}"
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        try:
            # link() is atomic and refuses to overwrite, on NFS too: the first failing node wins.
            os.link(tmp, self.job["job_dir"] / "FAILED")
        except FileExistsError:
            pass
        tmp.unlink()
        # After FAILED: a watcher that sees this node failed also sees whether restarts are left.
        self.set_state("failed", f"{process}: {reason}")

    def set_state(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        self.write_status(force=True)

    def write_status(self, force: bool = False, last: bool = False) -> None:
        # The end of a job that succeeded is written last (run()), after the launcher's own last lines: a watcher
        # that sees it (and packs the job's files at once) finds every log complete.
        if (self.state == "succeeded" and not last) or (not force and time.time() - self.status_written < STATUS_EVERY):
            return
        processes = [{"name": name, "pid": proc.pid, "returncode": proc.poll()} for name, proc in self.procs.items()]
        write_json(self.node_dir / "status.json", {"node": self.cfg.node_name, "state": self.state,
                                                   "reason": self.reason, "updated": time.time(),
                                                   "attempt": self.attempt, "processes": processes,
                                                   "listening": self.listening})
        self.status_written = time.time()

    def track_descendants(self) -> None:
        """A process that went to a session of its own (a program's choice): remember its group to stop it too."""
        for child in psutil.Process().children(recursive=True):
            try:
                self.pgids.add(os.getpgid(child.pid))
            except ProcessLookupError:
                pass

    def stop_all(self) -> None:
        """SIGTERM every process group we started, SIGKILL after the grace period; reap; clean /dev/shm."""
        self.track_descendants()
        if self.alive():
            self.say(f"stopping process groups {sorted(self.pgids)}")
            signal_groups(self.pgids, signal.SIGTERM)
            deadline = time.time() + self.cfg.grace
            while self.alive() and time.time() < deadline:
                self.write_status()
                time.sleep(0.2)
            if self.alive():
                self.say(f"still running after {self.cfg.grace:.0f} s: SIGKILL")
                signal_groups(self.pgids, signal.SIGKILL)
                deadline = time.time() + 10
                while self.alive() and time.time() < deadline:
                    time.sleep(0.2)
        removed = remove_orphaned_shm(self.shm_before)
        if removed:
            self.say(f"removed {len(removed)} /dev/shm files left by killed processes")
        self.write_status(force=True)

    def alive(self) -> bool:
        """Any process of ours left? Reaps our children (orphans become ours: we are a subreaper)."""
        for proc in self.procs.values():
            proc.poll()
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
            except (psutil.NoSuchProcess, ChildProcessError):
                pass
        return any(group_exists(pgid) for pgid in self.pgids)


class HeartbeatWatch:
    """When this launcher saw each heartbeat file change, by its own monotonic clock (never the writer's)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.seen: dict[Path, tuple[str, float]] = {}

    def stalled(self, timeout: float) -> Path | None:
        now = time.monotonic()
        for path in self.directory.glob("heartbeat-*[0-9]"):
            try:
                count = path.read_text()
            except OSError:
                continue
            if self.seen.get(path, ("",))[0] != count:
                self.seen[path] = (count, now)
        return next((path for path, (_, changed) in self.seen.items() if now - changed > timeout), None)


def current_attempt(job_dir: Path) -> int:
    """1 + the last attempt that failed and was archived (attempts/<n>/FAILED)."""
    archived = [int(path.parent.name) for path in job_dir.glob("attempts/*/FAILED") if path.parent.name.isdigit()]
    return max(archived, default=0) + 1


def die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def safe_connections(pid: int) -> list:
    """TCP connections of a process and its descendants (a server runs under `sh -c`)."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    connections = []
    for proc in family:
        try:
            connections += proc.net_connections(kind="tcp")
        except psutil.Error:
            pass
    return connections


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg: only living members matter.
    return any(p.status() != psutil.STATUS_ZOMBIE for p in psutil.process_iter() if safe_pgid(p.pid) == pgid)


def safe_pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def signal_groups(pgids: set[int], sig: signal.Signals) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def remove_orphaned_shm(before: set[str]) -> list[str]:
    """Remove /dev/shm files that appeared during the job and that no live process holds open or mapped."""
    new = set(os.listdir("/dev/shm")) - before
    if not new:
        return []
    held: set[str] = set()
    for proc in psutil.process_iter():
        try:
            held.update(Path(f.path).name for f in proc.open_files() if f.path.startswith("/dev/shm/"))
            held.update(Path(m.path).name for m in proc.memory_maps(grouped=True) if m.path.startswith("/dev/shm/"))
        except psutil.Error:
            pass
    removed = []
    for name in sorted(new - held):
        try:
            os.unlink(f"/dev/shm/{name}")
            removed.append(name)
        except OSError:
            pass
    return removed


def log_tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


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


def trainer_environment(rank: int, local_rank: int, per_machine: int, machines: int, machine_id: int,
                        master_addr: str, master_port: int) -> dict[str, str]:
    """What torchrun (which DGL's launch.py runs trainers with) gives each trainer: torch.distributed's env://
    rendezvous (rank 0 hosts it on the master port) and the ranks that programs read."""
    world = per_machine * machines
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(per_machine), "GROUP_RANK": str(machine_id), "GROUP_WORLD_SIZE": str(machines),
            "ROLE_NAME": "default", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none"}


def describe_exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def run(args: argparse.Namespace) -> int:
    cfg = settings(args)
    job = preflight(cfg)
    if args.check:
        emit_result({"changed": False, "node": cfg.node_name, "command": job["command"], "cwd": str(job["cwd"])})
        return 0
    job["node_dir"].mkdir(parents=True, exist_ok=True)
    if cfg.local:
        job["ip_config"].write_text(f"127.0.0.1 {cfg.server_port}\n")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    launcher = Launcher(cfg, job)
    launcher.log_file = open(job["node_dir"] / "launcher.log", "a")

    def on_signal(signum: int, frame) -> None:
        launcher.signal_received = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    launcher.say(f"machine {job['machine_id']} of {len(job['machines'])} ({job['address']}, {job['ifname']}); "
                 f"{cfg.num_servers} servers, {cfg.num_trainers} trainers, {cfg.num_samplers} samplers each")
    launcher.run()
    launcher.say(f"{launcher.state}" + (f": {launcher.reason}" if launcher.reason else ""))
    emit_result({"changed": True, "node": cfg.node_name, "state": launcher.state, "reason": launcher.reason})
    launcher.write_status(force=True, last=True)
    if launcher.state == "succeeded":
        return 0
    if launcher.signal_received:
        return 128 + launcher.signal_received
    return 0 if launcher.state == "stopped" else 1

"""Job control on a node, one command per host for the playbooks (roles/dgl_job_control): the job unit's state,
stopping it with the check for what it left, and the job to report on with its progress line.

    dglkit control unit
    dglkit control stop --user dglkit --server-port 30050 [--job-dir DIR] [--check]
    dglkit control progress --jobs /srv/dglkit/jobs [--units JSON]
    dglkit control ready --workspace /srv/dglkit [--worker --ports 30050,29500 --launch-config JSON --node-name n]
                         [--lock LOCK --lock-owner TEXT --job-dir DIR --nodes a,b]   (the storage host)
    dglkit control release --lock LOCK
    dglkit control start --unit-text "$(cat dglkit-job.service)"

Each prints one JSON line (with "changed"). `unit`, `stop` and `start` run as root; whatever they read or write in a job
directory (job.json, STOP) they do as the job account, without following a link the job planted. `ready` runs as
the job account with the node environment's Python: that it runs at all is part of what it checks.
"""

import argparse
import fnmatch
import glob
import hashlib
import importlib.util
import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dglkit import jobfiles, lock, mpijob, mpiunit
from dglkit.common import UserError, emit_result, read_json, replace_file
from dglkit.jobstate import earlier_run
from dglkit.settings import SETTINGS
from dglkit.systemd import exec_argv, parse_show, read_proc

UNIT = "dglkit-job.service"
UNIT_FILE = Path("/etc/systemd/system") / UNIT
SHOW = ("LoadState", "ActiveState", "UnitFileState", "WorkingDirectory", "Description", "ExecStart")
# The launcher's flags in the job unit's command (roles/dgl_job: __dgl_job_launch), as job.json's keys: root's record
# of what the job was started with. The job can rewrite job.json, never the unit.
RECORDED = {"--num-servers": "num_servers", "--master-port": "master_port", "--part-config": "part_config"}
# DGL names the graph's segments after the graph and the KVStore's after the data ("node~_N~feat-kvdata-").
SHM_PATTERNS = ("node~*", "edge~*")
STOP_NOTE = "stopped by playbooks/stop.yml\n"
# Written by site.yml's firewall role: the ports it opens to the cluster.
FIREWALL_RECORD = Path("/etc/dglkit/firewall.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    unit = actions.add_parser("unit", help="the job unit's state and job directory")
    unit.add_argument("--node", default="", help="this node's name, to begin the unit's line with")
    stop = actions.add_parser("stop", help="stop the job unit, keep it from starting at boot, check what is left")
    stop.add_argument("--user", required=True, help="the job account (writes STOP, reads job.json)")
    stop.add_argument("--job-dir", default="", help="the job to check when the unit names none")
    stop.add_argument("--server-port", type=int, required=True, help="first DGL server port")
    stop.add_argument("--servers", type=int, default=1, help="DGL servers per node when job.json does not say")
    stop.add_argument("--master-port", type=int, default=SETTINGS["master_port"].default,
                      help="torch's rendezvous port when job.json does not say")
    stop.add_argument("--graph", default="", help="graph name when job.json does not say (its /dev/shm segments)")
    stop.add_argument("--ports-wait", type=float, default=10, help="seconds the job's ports may take to close")
    stop.add_argument("--check", action="store_true", help="say what would change, change nothing")
    progress = actions.add_parser("progress", help="the job to report on and its progress line (as the job account)")
    progress.add_argument("--jobs", required=True, help="the workspace's jobs directory")
    progress.add_argument("--units", type=json.loads, default={},
                          help="JSON {worker: its unit as `dglkit control unit` describes it, or null: not reached}")
    start = actions.add_parser("start", help="install the job unit and start it, now and at boot (root)")
    start.add_argument("--unit-text", required=True, help="the unit file, as the playbook rendered it")
    ready = actions.add_parser("ready", help="what train.yml checks before it starts a job on this node (as the job "
                               "account): packages, ip_config.txt, the job unit, the job's ports, the firewall's")
    ready.add_argument("--workspace", required=True, type=Path, help="the shared workspace (its ip_config.txt)")
    ready.add_argument("--worker", action="store_true", help="a worker: read the firewall's record too")
    ready.add_argument("--ports", type=lambda text: [int(port) for port in text.split(",") if port], default=[],
                       help="the job's ports, comma separated, that must not be listening here")
    ready.add_argument("--ports-wait", type=float, default=1, help="seconds a port in use may take to close")
    ready.add_argument("--launch-config", type=json.loads,
                       help="a worker: job.json's content, for the launcher's checks (`dglkit launch --check`)")
    ready.add_argument("--node-name", default="", help="this worker's node name (with --launch-config)")
    ready.add_argument("--lock", help="the storage host: take the starter's lock first (a directory; held: its owner)")
    ready.add_argument("--lock-owner", default="", help="who takes the lock: user, controller, job, time")
    ready.add_argument("--job-dir", type=Path, help="the storage host: look for an earlier run of this job")
    ready.add_argument("--nodes", default="", help="the job's nodes, comma separated (with --job-dir)")
    ready.add_argument("--stale-after", type=float, default=120, help="as for `dglkit watch` (with --job-dir)")
    release = actions.add_parser("release", help="release the starter's lock that `ready --lock` took")
    release.add_argument("--lock", required=True, help="the lock directory")


def describe(props: dict[str, str], node: str = "") -> dict[str, Any]:
    """What the playbooks need of the unit: whether a job runs (also while it restarts or stops), its directory,
    a line for people."""
    running = props.get("ActiveState", "inactive") not in ("inactive", "failed")
    line = f"{props.get('Description', UNIT)}: {props['ActiveState']}" if running else "no job running"
    return {"loaded": props.get("LoadState", "not-found") != "not-found", "running": running,
            "state": props.get("ActiveState", "inactive"), "enabled": props.get("UnitFileState") == "enabled",
            "job_dir": props.get("WorkingDirectory", ""), "description": props.get("Description", UNIT),
            "launched": launched_with(props.get("ExecStart", "")), "line": f"{node}: {line}" if node else line}


def launched_with(exec_start: str) -> dict[str, Any]:
    """The RECORDED flags of the unit's command (`systemctl show -p ExecStart`: "{ path=… ; argv[]=… ; … }"), in
    range; {} for a unit written before the unit recorded them."""
    argv = exec_argv(exec_start)
    found = {RECORDED[flag]: int(value) if value.isdigit() else value
             for flag, value in zip(argv, argv[1:]) if flag in RECORDED}
    return jobfiles.typed(found, jobfiles.JOB)[0]


def show_unit(node: str = "") -> dict[str, Any]:
    """The job unit, with the mpi partition's unit (dglkit.mpiunit) under "partition"."""
    proc = subprocess.run(["systemctl", "show", UNIT, "-p", ",".join(SHOW)], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise UserError(f"systemctl show {UNIT}: {proc.stderr.strip()}")
    return {**describe(parse_show(proc.stdout), node), "partition": mpiunit.show(node)}


def as_account(user: str, action: Callable[[], Any]) -> Any:
    """action() run in a child process with the account's uid and gid and no other group: a link in a job
    directory resolves with the account's rights, never root's. Its value comes back as JSON."""
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise UserError(f"no account {user} on this host: run site.yml, which creates it") from None
    if os.geteuid() == account.pw_uid:
        return action()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        answer: dict[str, Any] = {"error": "the child process failed"}
        try:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            answer = {"value": action()}
        except OSError as error:  # reported by the parent, which has the terminal
            answer = {"error": f"{type(error).__name__}: {error}"}
        finally:
            # Whatever happens, the child never returns into the caller's code.
            try:
                with os.fdopen(write_end, "w") as out:
                    json.dump(answer, out)
            finally:
                os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        answer = json.loads(pipe.read() or '{"error": "the child process died"}')
    os.waitpid(pid, 0)
    if "error" in answer:
        raise UserError(f"as {user}: {answer['error']}")
    return answer["value"]


def cgroup_unit(pid: str) -> str:
    """The systemd unit (or scope) of a process, from its cgroup path (systemd's own hierarchy on a cgroup v1
    host, the unified one otherwise)."""
    paths = dict(line.split(":", 2)[1:] for line in (Path("/proc") / pid / "cgroup").read_text().splitlines())
    path = paths.get("name=systemd", paths.get("", ""))
    return path.rstrip("/").rpartition("/")[2] or "no unit"


def owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def job_processes(job_dir: str) -> list[str]:
    """The job's live processes, "<pid> (<user>, <unit>: <command>)": the launcher (its command line names
    <job dir>/job.json) and anything with DGLKIT_OUTPUT_DIR=<job dir> in its environment, as every process the
    launcher starts has, and their children: in the unit or escaped from it. Not by the PIDs in status.json: a
    process that escaped is in no record, and a recorded PID may since belong to another program."""
    job_dir = os.path.realpath(job_dir)
    found = []
    for pid in sorted(filter(str.isdigit, os.listdir("/proc")), key=int):
        command = [word for word in read_proc(pid, "cmdline") if word]
        if f"DGLKIT_OUTPUT_DIR={job_dir}" not in read_proc(pid, "environ") and f"{job_dir}/job.json" not in command:
            continue
        try:
            found.append(f"{pid} ({owner(os.stat(f'/proc/{pid}').st_uid)}, {cgroup_unit(pid)}: "
                         f"{' '.join(command)[:160]})")
        except OSError:
            continue  # gone since
    return found


def shm_segments(graph: str, shm: Path = Path("/dev/shm")) -> list[str]:
    """DGL's shared-memory segments: the graph's and the KVStore's (regular files, not hidden ones)."""
    patterns = SHM_PATTERNS + ((f"*{graph}*",) if graph else ())
    return sorted(str(entry.path) for entry in os.scandir(shm)
                  if entry.is_file(follow_symlinks=False) and not entry.name.startswith(".")
                  and any(fnmatch.fnmatch(entry.name, pattern) for pattern in patterns))


def listening(ports: list[int], proc_net: Path = Path("/proc/net")) -> list[int]:
    """Those of ports that a TCP socket of this host's network listens on, on any address."""
    found = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue  # no IPv6
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found.add(int(fields[1].rpartition(":")[2], 16))
    return [port for port in ports if port in found]


def still_listening(ports: list[int], wait: float) -> list[int]:
    """Those of ports that still listen after up to wait seconds (a job that just ended closes them)."""
    deadline = time.time() + wait
    while (busy := listening(ports)) and time.time() < deadline:
        time.sleep(0.2)
    return busy


def leftovers(job_dir: str, config: dict[str, Any], args: argparse.Namespace, shm: Path = Path("/dev/shm")) -> list[str]:
    """What a stopped job left on this host, in words; its ports get --ports-wait seconds to close. config: what
    the job was started with (num_servers, master_port, part_config, each typed and in range), else the command's
    own settings."""
    servers = config.get("num_servers", args.servers)
    ports = [*range(args.server_port, args.server_port + servers), config.get("master_port", args.master_port)]
    # A name from a file, matched literally: a "*" in it is no pattern that takes in every segment of the host.
    graph = glob.escape(Path(config["part_config"]).stem) if config.get("part_config") else args.graph
    busy = still_listening(ports, args.ports_wait)
    processes, segments = job_processes(job_dir), shm_segments(graph, shm)
    return ((["processes " + ", ".join(processes)] if processes else [])
            + (["/dev/shm files " + ", ".join(segments)] if segments else [])
            + ([f"port(s) {', '.join(map(str, busy))} listening"] if busy else []))


def request_stop(job_dir: str) -> None:
    """STOP tells every launcher that this is a stop, not a failure to restart from (a host shutting down also
    stops the unit). A new file renamed over the name: nothing is written through a link."""
    replace_file(Path(job_dir) / "STOP", STOP_NOTE.encode())


def systemctl(*args: str) -> None:
    proc = subprocess.run(["systemctl", *args, UNIT], capture_output=True, text=True, check=False)
    # 5: the unit is gone (the launcher ended the job since the look): nothing to stop.
    if proc.returncode not in (0, 5):
        raise UserError(f"systemctl {' '.join(args)} {UNIT}: {proc.stderr.strip()}")


def stop(args: argparse.Namespace) -> dict[str, Any]:
    """By unit, never by process name: the unit's cgroup holds every process the job started, and the launcher
    turns SIGTERM into an orderly stop of them."""
    unit = show_unit()
    job_dir = unit["job_dir"] or args.job_dir
    done = (["asked the job to stop", "stopped the job unit"] if unit["running"] else []) + (
        ["kept the job unit from starting at boot"] if unit["enabled"] else []) + (
        ["stopped the mpi partition"] if unit["partition"]["running"] else [])
    result = {"changed": bool(done), "done": done, "unit": unit, "job_dir": job_dir, "left": []}
    if args.check:
        return result
    if unit["partition"]["running"]:
        mpiunit.stop_unit()
    ranks = mpiunit.rank_processes(args.ports_wait)
    result["left"] += ["mpi partition ranks " + ", ".join(ranks)] if ranks else []
    if unit["running"]:
        if unit["job_dir"]:
            as_account(args.user, lambda: request_stop(unit["job_dir"]))
        systemctl("stop")
    if unit["enabled"]:
        systemctl("disable")
    if job_dir:
        # job.json only for what the unit does not record (a unit of an earlier version): the job may rewrite it.
        config = as_account(args.user, lambda: jobfiles.record(Path(job_dir) / "job.json", jobfiles.JOB)) or {}
        result["left"] += leftovers(job_dir, {**config, **(unit["launched"] if unit["job_dir"] else {})}, args)
    return result


def job_dirs(jobs: Path) -> list[Path]:
    """The job directories under jobs/, newest first (not the start lock, nor a link)."""
    try:
        entries = [entry for entry in os.scandir(jobs) if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    return [Path(entry.path) for entry in sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)]


def pick_job(jobs: Path, units: list[dict[str, Any]]) -> Path | None:
    """The job a unit runs, else the one the units ran last, else the newest job directory."""
    chosen = [Path(unit["job_dir"]) for unit in sorted(units, key=lambda unit: not unit["running"])
              if unit["job_dir"] and Path(unit["job_dir"]).is_dir()]
    chosen = chosen or job_dirs(jobs)
    return chosen[0] if chosen else None


def job_line(job_dir: Path | None, jobs: str) -> tuple[str | None, str]:
    """The job's state and its progress line, by `dglkit watch --wait 0` (the one reader of a job's state)."""
    if job_dir is None:
        return None, f"no job in {jobs} yet"
    proc = subprocess.run([sys.executable, "-m", "dglkit", "watch", "--job-dir", str(job_dir), "--wait", "0"],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        return None, f"{job_dir.name}: {proc.stderr.strip()}"
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    return state["state"], f"{job_dir.name}: {state['line']}"


def progress(args: argparse.Namespace) -> dict[str, Any]:
    """status.yml's report: each worker's unit, the job's progress, the workers that could not be reached."""
    reached = {host: unit for host, unit in args.units.items() if unit is not None}
    job_dir = pick_job(Path(args.jobs), list(reached.values()))
    state, line = job_line(job_dir, args.jobs)
    down = [host for host, unit in args.units.items() if unit is None]
    # A partition before the job: the first worker's unit names its directory and hosts; its ranks' progress files
    # are read here, as the job account.
    partitions = [mpijob.look(Path(unit["partition"]["out"]), unit["partition"]["hosts"], "active")["line"]
                  for unit in reached.values() if unit.get("partition", {}).get("hosts")]
    lines = ([unit["line"] for unit in reached.values()] + partitions + [line]
             + ([(f"could not reach {', '.join(down)}: its job unit is not shown (the progress above is the shared "
                  "job directory's)")] if down else []))
    return {"changed": False, "job": job_dir.name if job_dir else None, "state": state, "lines": lines}


def start(args: argparse.Namespace) -> dict[str, Any]:
    """The unit file, then systemd's reload and the start: one round trip for the playbook instead of three."""
    replace_file(UNIT_FILE, args.unit_text.encode())
    # One reload (enable would reload again by itself): systemd reads the new file, then enables and starts it.
    for command in (["daemon-reload"], ["enable", "--now", "--no-reload", UNIT]):
        proc = subprocess.run(["systemctl", *command], capture_output=True, text=True, check=False)
        if proc.returncode:
            raise UserError(f"systemctl {' '.join(command)}: {proc.stderr.strip()}")
    return {"changed": True}


def file_record(path: Path) -> dict[str, Any]:
    """What train.yml compares of ip_config.txt across the hosts: equal content and time, one shared file."""
    try:
        content, status = path.read_bytes(), path.stat()
    except FileNotFoundError:
        return {"exists": False}
    return {"exists": True, "checksum": hashlib.sha1(content).hexdigest(), "mtime": status.st_mtime,
            "lines": [line.strip() for line in content.decode(errors="replace").splitlines() if line.strip()]}


def ready(args: argparse.Namespace) -> dict[str, Any]:
    """One look per host instead of a task per check (each task is a round trip); the playbook judges the
    answers, some of which it compares across hosts. On the storage host it also takes the starter's lock and
    then looks for an earlier run of the job, which the lock keeps another starter from changing meanwhile."""
    missing = [name for name in ("dgl", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"no {', '.join(missing)} in {sys.prefix}")
    answer: dict[str, Any] = {"changed": False}
    holder = lock.take(args.lock, args.lock_owner) if args.lock else None
    if args.lock:
        answer["lock"] = {"taken": holder is None, "held_by": holder}
    try:
        answer.update(ip_config=file_record(args.workspace / "ip_config.txt"), unit=show_unit(),
                      busy_ports=still_listening(args.ports, args.ports_wait),
                      firewall=read_json(FIREWALL_RECORD) if args.worker else None)
        if args.launch_config is not None:
            from dglkit.launcher.preflight import check_ahead  # psutil and the launcher's modules: workers only

            answer["launch"] = check_ahead(args.launch_config, args.node_name, answer["unit"]["running"])
        if args.job_dir and holder is None:
            answer["previous"] = earlier_run(args.job_dir, [node for node in args.nodes.split(",") if node],
                                             args.stale_after)
    except BaseException:
        # The playbook releases only a lock that an answer says was taken: a failed look answers nothing.
        if args.lock and holder is None:
            lock.release(args.lock)
        raise
    return answer


def release(args: argparse.Namespace) -> dict[str, Any]:
    """The starter's lock that `ready --lock` took (train.yml releases it once its launchers run, or it failed)."""
    lock.release(args.lock)
    return {"changed": False}


def run(args: argparse.Namespace) -> int:
    actions = {"unit": lambda args: {"changed": False, "unit": show_unit(args.node)}, "stop": stop, "progress": progress,
               "ready": ready, "start": start, "release": release}
    emit_result(actions[args.action](args))
    return 0

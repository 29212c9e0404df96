"""Every check that can fail before anything starts, on every node, and the job's layout they derive: which
ip_config line this node is, its address and ports, the command to run and its environment's PATH."""

import argparse
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

import psutil

from dglkit import kinds, nodedata
from dglkit.blame import failed_file, restart_refused
from dglkit.common import UserError, check_machine_count, read_partition_config
from dglkit.launcher.command import BUILTIN_COMMAND, check_executables, expand, graph_name, in_program_dir
from dglkit.launcher.options import DEFAULTS, check_numbers, settings
from dglkit.resources import GB, host_memory, training_estimate
from dglkit.settings import SETTINGS


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
        problem = SETTINGS["server_port"].problem(machines[-1][1])
        if problem:
            raise UserError(f"{path} line {number}: port {machines[-1][1]}: {problem}")
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


def job_over(cfg: argparse.Namespace) -> str | None:
    """Why the job in --job-dir has failed for good (its FAILED file ends it), or None. A FAILED that another
    attempt follows is a restart in progress, which a launcher started late (a host back from a reboot) joins."""
    failed = failed_file(Path(cfg.job_dir)) if cfg.job_dir else None
    if failed is None:
        return None
    refused = restart_refused(Path(cfg.job_dir), failed, cfg.max_restarts)
    return f"the job failed on node {failed.get('node')} ({refused})" if refused else None


def check_job_open(cfg: argparse.Namespace, job_dir: Path) -> None:
    """The job has neither failed for good nor been stopped."""
    over = job_over(cfg)
    if over:
        raise UserError(f"{job_dir}/FAILED exists: {over}; start a new job directory")
    if (job_dir / "STOP").exists():
        raise UserError(f"{job_dir}/STOP exists: this job was stopped; start a new job directory")


def job_machines(cfg: argparse.Namespace, job_dir: Path) -> tuple[Path, list[tuple[str, int]]]:
    """The ip_config file and its machines."""
    if cfg.local:
        # Written by run() once every check has passed.
        return job_dir / "ip_config.txt", [("127.0.0.1", cfg.server_port)]
    if not cfg.ip_config:
        raise UserError("no ip_config: pass --ip-config (or --local to run on this machine alone)")
    ip_config = Path(cfg.ip_config).resolve()
    if not ip_config.is_file():
        raise UserError(f"ip_config {ip_config} not found")
    return ip_config, read_ip_config(ip_config)


def this_machine(cfg: argparse.Namespace, machines: list[tuple[str, int]], ip_config: Path,
                 interfaces: dict[str, str]) -> int:
    """This node's ip_config line: --machine-id, or the first line whose address is on a local interface."""
    if cfg.machine_id is not None:
        if not 0 <= cfg.machine_id < len(machines):
            raise UserError(f"--machine-id {cfg.machine_id} is not a line of {ip_config} (0..{len(machines) - 1})")
        return int(cfg.machine_id)
    local_lines = [i for i, (address, _) in enumerate(machines) if address in interfaces]
    if not local_lines:
        raise UserError(f"none of this node's addresses {sorted(interfaces)} is in {ip_config}: run on a "
                        "listed machine or pass --machine-id")
    return local_lines[0]


def check_nodes(cfg: argparse.Namespace, machines: list[tuple[str, int]]) -> None:
    if cfg.nodes and (len(cfg.nodes) != len(machines) or cfg.node_name not in cfg.nodes):
        raise UserError(f"--nodes {','.join(cfg.nodes)}: give one name per ip_config line ({len(machines)}), "
                        f"including this node's {cfg.node_name}")


def job_command(cfg: argparse.Namespace, values: dict[str, Any], program_dir: Path) -> tuple[str, str]:
    """The command to run (placeholders expanded, programs found) and the PATH it runs with."""
    bin_dir = Path(cfg.python_env or sys.prefix) / "bin"
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    template = cfg.command or " ".join([BUILTIN_COMMAND, *map(shlex.quote, cfg.train_args)])
    command = in_program_dir(expand(template, values), program_dir)
    check_executables(command, program_dir, path, cfg.node_name)
    return command, path


def check_memory(cfg: argparse.Namespace, part_config: Path, partition: dict[str, Any], machine_id: int) -> None:
    """Refuse a node whose available memory cannot hold its part while its server loads it, with the figures."""
    part = partition.get(f"part-{machine_id}", {})
    node_data, graph = (file_size(part_config.parent / str(part.get(key, ""))) for key in ("node_feats", "part_graph"))
    processes = cfg.num_servers - 1 + cfg.num_trainers * (1 + cfg.num_samplers)
    need = training_estimate(node_data, graph, processes)
    have, source = host_memory()
    if need > have:
        raise UserError(
            f"{cfg.node_name} needs about {need / GB:.1f} GB of memory to train on part {machine_id} (its server "
            f"holds the part's {node_data / GB:.2f} GB of node data twice while loading it, and {processes} more "
            f"processes run); it has {have / GB:.1f} GB available ({source}). Ways out: more workers (smaller parts), "
            "fewer trainers or samplers per node, or a host with more memory")


def file_size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def preflight(cfg: argparse.Namespace, ahead: bool = False, memory: bool = True) -> dict:
    """Every check that can fail before anything starts; returns the derived layout of the job. `ahead`: train.yml's
    pre-flight, before it makes the job directory for this run (an earlier run's FAILED and STOP then move to
    history/) and with the ports judged by `dglkit control ready` (which knows whether the job runs already).
    `memory`: whether this node's memory is there for the job (not while the job runs already)."""
    if not cfg.job_dir:
        raise UserError("no job directory: pass --job-dir or --config <job dir>/job.json")
    if not cfg.part_config:
        raise UserError("no partition: pass --part-config <partition dir>/<graph>.json")
    job_dir = Path(cfg.job_dir).resolve()
    if not ahead:
        check_job_open(cfg, job_dir)
    check_numbers(cfg)
    ip_config, machines = job_machines(cfg, job_dir)
    part_config = Path(cfg.part_config).resolve()
    partition = read_partition_config(part_config)
    check_machine_count(part_config, partition["num_parts"], ip_config, len(machines))
    # Whether the graph is heterogeneous only the partition tells (a files dataset): refused here, on every
    # node, before anything starts.
    task_error = kinds.task_error(cfg.train["task"], partition, part_config) if "task" in cfg.train else None
    if task_error and not cfg.command:
        raise UserError(task_error)
    interfaces = local_interfaces()
    machine_id = this_machine(cfg, machines, ip_config, interfaces)
    address, port = machines[machine_id]
    if memory:
        check_memory(cfg, part_config, partition, machine_id)
    for s in range(cfg.num_servers if not ahead else 0):
        check_port_free(address, port + s, f"DGL server {s}")
    if machine_id == 0 and not ahead:
        check_port_free(address, cfg.master_port, "torch.distributed master port")
    check_nodes(cfg, machines)
    program_dir = Path(cfg.program_dir).resolve() if cfg.program_dir else job_dir
    if not program_dir.is_dir() and (cfg.program_dir or not ahead):
        raise UserError(f"program directory {program_dir} not found on {cfg.node_name}: ship the program first")
    served_names = nodedata.served_names(part_config, cfg.node_data_names)
    values = {"ip_config": ip_config, "part_config": part_config, "graph_name": graph_name(part_config),
              "output_dir": job_dir, "job_dir": job_dir, "program_dir": program_dir, "node_name": cfg.node_name,
              "machine_id": machine_id, "num_machines": len(machines), "num_servers": cfg.num_servers,
              "num_trainers": cfg.num_trainers, "num_samplers": cfg.num_samplers}
    command, path = job_command(cfg, values, program_dir)
    return {"job_dir": job_dir, "ip_config": ip_config, "part_config": part_config, "machines": machines,
            "machine_id": machine_id, "address": address, "port": port, "command": command, "cwd": job_dir,
            "program_dir": program_dir, "served_names": served_names, "path": path,
            "ifname": interfaces.get(address, "lo"), "node_dir": job_dir / "nodes" / cfg.node_name}


def check_ahead(config: dict[str, Any], node_name: str, running: bool) -> dict[str, Any]:
    """`--check` on job.json's content before train.yml writes the file (`dglkit control ready`: one round trip
    fewer). {"checked": false} while the partition is still to be made: train.yml then runs `--check` after it.
    `running`: a job runs on this node already (its memory is in use)."""
    cfg = settings(argparse.Namespace(config=None, node_name=node_name), config)
    if not cfg.part_config or not Path(cfg.part_config).is_file():
        return {"checked": False, "error": None}
    try:
        preflight(cfg, ahead=True, memory=not running)
    except UserError as error:
        return {"checked": True, "error": str(error)}
    return {"checked": True, "error": None}

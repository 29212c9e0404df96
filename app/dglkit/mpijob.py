"""`dglkit mpi`: the partition of a graph no host holds (Ansible: dgl_job_partition_builder: mpi) across the
workers at once, as roles/dgl_dataset runs it.

  check --dataset-dir D --out P --num-parts W   every worker, as the job account, before anything starts: this
      host's estimate for its rank against its available memory (refused naming both and the worker count that
      would fit); prints whether P is this dataset's complete partition already and the run's unit state.
  run --dataset-dir D --out P --graph-name G --hosts NAME=ADDRESS,...   the first worker, in the transient unit
      dglkit-partition.service: mpirun of dglkit.mpiassign, then of dglkit.mpibuild, one rank per host in that
      order, Open MPI's TCP on the first host's network. Its files are under P.tmp/ (hostfile, a log per program,
      progress/rank<r>.json); P is removed first and is there again only once complete; a failure leaves
      P.tmp/failed.json naming the host.
  watch --out P --hosts NAME=ADDRESS,... [--wait S]   the unit's state and each rank's progress, one JSON line.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dglkit import mpiblame, mpibuild, ptscotch
from dglkit.common import UserError, emit_result, read_json, write_json
from dglkit.mpicomm import PROGRESS_ENV, open_input
from dglkit.resources import GB, host_memory, mpi_rank_estimate, mpi_ranks_needed

UNIT = "dglkit-partition.service"
RUNNING = ("active", "activating", "deactivating", "reloading")
STOPPED = "stopped (SIGTERM: playbooks/stop.yml, or systemctl stop of its unit)"
# ssh gives up on a peer that stopped answering (a host that died without closing its connections), so that
# mpirun learns of a lost daemon in seconds instead of the kernel's TCP timeout.
SSH_OPTIONS = "-o BatchMode=yes -o ServerAliveInterval=5 -o ServerAliveCountMax=3"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="this worker's memory against its rank's estimate; is P done?")
    check.add_argument("--dataset-dir", required=True, type=Path, help="a dataset prepared with --arrays, or chunked")
    check.add_argument("--out", required=True, type=Path, help="the partition directory")
    check.add_argument("--num-parts", required=True, type=int, help="the workers, one rank and one part each")
    check.add_argument("--memory-gb", type=float, help="memory this host may use, in GB (default: what it has)")
    check.add_argument("--graphbolt", action="store_true", help="P is done only with its GraphBolt graphs")
    run = actions.add_parser("run", help="mpirun of the assignment and the build (in the partition unit)")
    run.add_argument("--dataset-dir", required=True, type=Path, help="a dataset prepared with --arrays, or chunked")
    run.add_argument("--out", required=True, type=Path, help="the partition directory")
    run.add_argument("--graph-name", required=True, help="DistGraph name; the config is <name>.json")
    run.add_argument("--hosts", required=True, type=host_list, help="NAME=ADDRESS,... one rank each, in order")
    run.add_argument("--batch-edges", type=int, help="edges per exchange round (default: the programs')")
    run.add_argument("--graphbolt", action="store_true", help="each rank also writes its part's GraphBolt graph")
    watch = actions.add_parser("watch", help="the run's state and each rank's progress, one JSON line")
    watch.add_argument("--out", required=True, type=Path, help="the partition directory")
    watch.add_argument("--hosts", required=True, type=host_list, help="NAME=ADDRESS,... as given to run")
    watch.add_argument("--wait", type=float, default=0, help="seconds to wait for the run to end (%(default)s)")


def host_list(text: str) -> dict[str, str]:
    pairs = [item.partition("=") for item in text.split(",") if item]
    if len(pairs) < 2 or any(not name or not address for name, _, address in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: give two or more NAME=ADDRESS pairs, comma-separated")
    return {name: address for name, _, address in pairs}


def run(args: argparse.Namespace) -> int:
    return {"check": check, "run": run_job, "watch": watch}[args.action](args)


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".tmp")


def complete(out: Path, fingerprint: str | None, num_parts: int, graphbolt: bool = False) -> bool:
    manifest = read_json(out / "manifest.json") or {}
    return bool(manifest.get("complete")) and manifest.get("num_parts") == num_parts and (
        fingerprint is None or manifest.get("dataset_fingerprint") == fingerprint) and (
        manifest.get("graphbolt", False) or not graphbolt)


def unit_state() -> str:
    return subprocess.run(["systemctl", "is-active", UNIT], capture_output=True, text=True).stdout.strip()


def check_packages() -> None:
    """What site.yml installs with dglkit_mpi: true, present on this host."""
    missing = [what for what, found in (
        ("Open MPI's mpirun (openmpi-bin)", shutil.which("mpirun")),
        ("PT-Scotch's int64 libraries (libscotch-7.0, libptscotch-7.0)",
         all((ptscotch.LIBRARY_DIR / name).is_file() for name in ptscotch.LIBRARIES)))
        if not found]
    if missing:
        raise UserError(f"{os.uname().nodename}: {' and '.join(missing)} not installed: set dglkit_mpi: true in the "
                        "inventory and run site.yml")


def check(args: argparse.Namespace) -> int:
    check_packages()
    dataset = read_json(args.dataset_dir / "dataset.json")
    if dataset is None or ("arrays" not in dataset and dataset.get("format") != "chunked"):
        raise UserError(f"{args.dataset_dir} is neither a dataset prepared with --arrays nor a graph in DGL's chunked "
                        "format: run its prepare step first")
    data = open_input(args.dataset_dir)
    mpibuild.check_supported(args.dataset_dir, data, args.graphbolt)  # metadata.json only
    # A heterogeneous graph's node data, as if every node had the widest type's features: an upper bound.
    widest = max([t.get("feat_dim", 0) for t in dataset.get("node_types", {}).values()], default=0)
    sizes = (dataset["num_nodes"], dataset["num_edges"], max(dataset.get("feat_dim", 0), widest))
    words = mpibuild.edge_words(data)  # from the data's headers
    need = mpi_rank_estimate(*sizes, args.num_parts, words)
    have, source = host_memory() if args.memory_gb is None else (int(args.memory_gb * GB), "--memory-gb")
    if need > have:
        fewest = mpi_ranks_needed(*sizes, have, words)
        way_out = (f"with {fewest} workers each would need about {mpi_rank_estimate(*sizes, fewest, words) / GB:.1f} GB: add "
                   "workers, or free memory on this host" if fewest else "no number of workers fits: free memory "
                   "on this host")
        raise UserError(f"{os.uname().nodename}: the mpi partition's rank needs about {need / GB:.1f} GB with "
                        f"{args.num_parts} workers; this host has {have / GB:.1f} GB available ({source}); {way_out}")
    emit_result({"changed": False, "done": complete(args.out, dataset.get("fingerprint"), args.num_parts, args.graphbolt),
                 "unit": unit_state(), "estimated_memory_gb": round(need / GB, 2),
                 "available_memory_gb": round(have / GB, 2)})
    return 0


def run_job(args: argparse.Namespace) -> int:
    work = work_dir(args.out)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(args.out, ignore_errors=True)  # replaced: from now on only a complete one may stand there
    (work / "progress").mkdir(parents=True)
    (work / "hostfile").write_text("".join(f"{address}\n" for address in args.hosts.values()))
    mpirun = mpirun_command(work, len(args.hosts), mpiblame.local_network(next(iter(args.hosts.values()))))
    assignment, partition = work / "assignment", work / "partition"
    steps = [("assign", ["dglkit.mpiassign", "--dataset-dir", args.dataset_dir, "--num-parts", len(args.hosts),
                         "--out", assignment]),
             ("build", ["dglkit.mpibuild", "--dataset-dir", args.dataset_dir, "--assignment", assignment,
                        "--out", partition, "--graph-name", args.graph_name])]
    if args.batch_edges:
        for _, command in steps:
            command += ["--batch-edges", args.batch_edges]
    if args.graphbolt:
        steps[-1][1].append("--graphbolt")
    started = time.time()
    signal.signal(signal.SIGTERM, stopped)
    for step, command in steps:
        write_json(work / "step.json", {"step": step, "started": time.time()})
        log = work / f"{step}.log"
        try:
            with open(log, "wb") as output:
                code = subprocess.run([*mpirun, sys.executable, "-m", *map(str, command)], stdout=output,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        except Stopped:  # subprocess.run killed mpirun on its way out
            write_json(work / "failed.json", {"step": step, "stopped": True, "reason": STOPPED, "log": str(log),
                                              "tail": mpiblame.tail(log)})
            print(f"dglkit mpi: {step} {STOPPED}", file=sys.stderr)
            return 1
        if code:
            host, reason = mpiblame.blame(log.read_text(errors="replace"), args.hosts, work / "progress")
            write_json(work / "failed.json", {"step": step, "exit_code": code, "host": host, "reason": reason,
                                              "log": str(log), "tail": mpiblame.tail(log)})
            print(f"dglkit mpi: {step} failed on {host or 'an unknown host'}: {reason}", file=sys.stderr)
            return 1
    os.replace(partition, args.out)
    shutil.rmtree(work)
    emit_result({"changed": True, "out": str(args.out), "seconds": round(time.time() - started, 1)})
    return 0


class Stopped(Exception):
    """SIGTERM: stop.yml stopped the partition's unit (systemd signals every process in it)."""


def stopped(signum: int, frame: object) -> None:
    raise Stopped


def mpirun_command(work: Path, ranks: int, network: str) -> list[str]:
    """One rank per host in the hostfile's order (rank r on host r), TCP on the cluster network alone, every
    rank writing its progress under work/progress/. The ranks' listening ports are pinned to the ephemeral
    range, which the kit's firewall opens to cluster addresses only: Open MPI's btl_tcp would otherwise take
    the first free port from 1024 up, on IPv4 and IPv6 alike (its daemons' oob_tcp binds ephemeral ports)."""
    low, high = ephemeral_ports()
    return ["mpirun", "--hostfile", str(work / "hostfile"), "-np", str(ranks), "--map-by", "node",
            "--bind-to", "none", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", network,
            "--mca", "oob_tcp_if_include", network,
            *[arg for family in ("v4", "v6") for arg in ("--mca", f"btl_tcp_port_min_{family}", str(low),
                                                           "--mca", f"btl_tcp_port_range_{family}", str(high - low + 1))],
            "--mca", "plm_rsh_args", SSH_OPTIONS,
            "-x", f"{PROGRESS_ENV}={work / 'progress'}", "-x", "DGLBACKEND=pytorch"]


def ephemeral_ports() -> tuple[int, int]:
    """The host's ephemeral port range (the firewall role opens the one it reads from the same file)."""
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def look(out: Path, hosts: dict[str, str], state: str | None = None) -> dict[str, Any]:
    """{"state": running | succeeded | failed, "line", "nodes": {name: its rank's progress}, "failed_host",
    "message"}. state: the unit's, when the caller has it (status.yml, away from the first worker)."""
    work = work_dir(out)
    progress = mpiblame.progress(work / "progress")
    nodes = {name: mpiblame.describe(progress.get(rank)) for rank, name in enumerate(hosts)}
    state = unit_state() if state is None else state
    step = (read_json(work / "step.json") or {}).get("step", "start")
    if state in RUNNING:
        shown = ", ".join(f"{name} {what}" for name, what in nodes.items())
        return {"state": "running", "nodes": nodes, "line": f"partition (mpi) running: {step} [{shown}]"}
    if complete(out, None, len(hosts)):
        return {"state": "succeeded", "nodes": nodes, "line": f"partition (mpi) succeeded: {out}"}
    failed = read_json(work / "failed.json") or {}
    if failed.get("stopped"):
        message = f"the mpi partition was {STOPPED} in its {failed.get('step')} step; the next train.yml starts it afresh"
        return {"state": "stopped", "nodes": nodes, "failed_host": None, "message": message, "tail": [],
                "line": f"partition (mpi) stopped: {message}"}
    host = failed.get("host")
    message = (f"the mpi partition failed in its {failed['step']} step on {host or 'an unknown host'}: "
               f"{failed['reason']}; log {failed['log']}" if failed else
               f"the mpi partition's unit ended ({state or 'gone'}) without finishing or saying why: journalctl -u {UNIT} "
               f"on {next(iter(hosts))}")
    return {"state": "failed", "nodes": nodes, "failed_host": host, "message": message,
            "tail": failed.get("tail", []), "line": f"partition (mpi) failed: {message}"}


def watch(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.wait
    while True:
        state = look(args.out, args.hosts)
        if state["state"] != "running" or time.monotonic() >= deadline:
            break
        time.sleep(1)
    print(json.dumps(state))
    return 0

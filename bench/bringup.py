"""Benchmark cluster bring-up: wall time of site.yml on fresh test hosts, then of idempotent re-runs with the
kit's ansible.cfg and with single settings turned back to Ansible's defaults (which settings help).
Appends to bench/results/bringup.jsonl.

    .venv/bin/python bench/bringup.py --hosts 2,4,8 --reruns 3
    .venv/bin/python bench/bringup.py --quick
"""

import argparse
import os
import re
import resource
import time
from pathlib import Path

import benchlib
import clusterlib

# Idempotent re-runs: the kit's ansible.cfg, then one setting at a time put back to Ansible's default.
VARIANTS = {
    "kit": {},
    "no-pipelining": {"ANSIBLE_PIPELINING": "False"},
    "no-controlpersist": {"ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o ServerAliveInterval=15"},
    "forks5": {"ANSIBLE_FORKS": "5"},
    "ansible-defaults": {"ANSIBLE_PIPELINING": "False", "ANSIBLE_FORKS": "5",
                         "ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o ServerAliveInterval=15"},
}
TASK_TIME_RE = re.compile(r"^(.+?) -{3,} (\d+\.\d+)s$", re.M)
LOGS = Path("/var/tmp/dglkit-bench/logs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="2,4,8", help="comma list of cluster sizes (node1 storage, rest workers)")
    parser.add_argument("--reruns", type=int, default=3, help="idempotent re-runs per variant (medians reported)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of: {', '.join(VARIANTS)}")
    parser.add_argument("--existing", action="store_true",
                        help="only re-runs, on clusters bringup<N> that an earlier --keep-cluster run left up")
    parser.add_argument("--cluster", help="with --existing and one --hosts size: re-run on this cluster instead")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the last cluster running")
    benchlib.add_common_arguments(parser, "2 hosts, one re-run, kit settings only")
    args = benchlib.parse(parser, "bringup", print_table)
    if args is None:
        return
    sizes = [int(n) for n in args.hosts.split(",")]
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if args.quick:
        sizes, args.reruns, variants = [2], 1, ["kit"]
    LOGS.mkdir(parents=True, exist_ok=True)

    rows = []
    for hosts in sizes:
        cluster = clusterlib.named(args.cluster if args.existing and args.cluster else f"bringup{hosts}")
        if not args.existing:
            cluster.down()  # fresh hosts: nothing left from an earlier run
            start = time.perf_counter()
            cluster.up(hosts)
            up_s = round(time.perf_counter() - start, 2)
        try:
            if not args.existing:
                rows.append(record(cluster, hosts, "first run", "kit", 0, {}, up_s))
            for variant in variants:
                for rerun in range(args.reruns):
                    rows.append(record(cluster, hosts, "re-run", variant, rerun, VARIANTS[variant], None))
        finally:
            if not (args.keep_cluster and hosts == sizes[-1]):
                cluster.down()
    print_table(rows)


def record(cluster: clusterlib.Cluster, hosts: int, stage: str, variant: str, run: int, env: dict,
           up_s: float | None) -> dict:
    figures = site(cluster, {**env, "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"},
                   LOGS / f"{cluster.name}-{stage.replace(' ', '-')}-{variant.replace(' ', '-')}-{run}.log")
    if up_s is not None:
        figures["hosts_up_s"] = up_s
    params = {"hosts": hosts, "cluster": cluster.name, "stage": stage, "variant": variant, "env": env, "run": run}
    line = benchlib.append("bringup", {"params": params, "figures": figures})
    print(f"{hosts} hosts, {stage}, {variant}, run {run}: {figures['wall_s']} s, changed {figures['changed']}, "
          f"failed {figures['failed']}, load {figures['load_before']}->{figures['load_after']}", flush=True)
    return line


def site(cluster: clusterlib.Cluster, env: dict, log: Path) -> dict:
    """One `ansible-playbook site.yml` run: wall time, PLAY RECAP totals and the slowest tasks."""
    load_before = os.getloadavg()[0]
    busy_before, children_before = machine_busy_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = cluster.playbook("site.yml", check=False, timeout=None, env=env)
    wall = round(time.perf_counter() - start, 2)
    # The hosts share this machine's cores with the controller: its CPU time (ansible-playbook, its forks and
    # SSH clients) against everything the cores did meanwhile, which is mostly the hosts running modules.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    controller_cpu = (children.ru_utime - children_before.ru_utime) + (children.ru_stime - children_before.ru_stime)
    machine_cpu = machine_busy_s() - busy_before
    log.write_text(run.output)
    slowest = sorted(((float(t), task.strip()) for task, t in TASK_TIME_RE.findall(run.output)), reverse=True)[:5]
    return {"wall_s": wall, "returncode": run.returncode, "log": str(log),
            "changed": sum(r["changed"] for r in run.recap.values()),
            "failed": sum(r["failed"] for r in run.recap.values()),
            "slowest_tasks": [[task, t] for t, task in slowest],
            "controller_cpu_s": round(controller_cpu, 1), "machine_cpu_s": round(machine_cpu, 1),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def machine_busy_s() -> float:
    """CPU seconds all cores of this machine have spent busy since boot (/proc/stat, without idle and iowait)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, open("/proc/stat").readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def print_table(rows: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        p = row["params"]
        # Re-runs on another cluster (--existing --cluster) are a row of their own.
        cluster = p.get("cluster", f"bringup{p['hosts']}")
        groups.setdefault((p["hosts"], p["stage"] != "first run", list(VARIANTS).index(p["variant"]), cluster),
                          []).append(row)
    out = []
    for (hosts, _, _, cluster), lines in sorted(groups.items()):
        f = [line["figures"] for line in lines]
        p = lines[0]["params"]
        loads = [x["load_before"] for x in f] + [x["load_after"] for x in f]
        out.append([hosts if cluster == f"bringup{hosts}" else f"{hosts} ({cluster})", p["stage"], p["variant"],
                    benchlib.spread([x["wall_s"] for x in f if x["returncode"] == 0]),
                    "/".join(str(x["changed"]) for x in f), sum(x["returncode"] != 0 for x in f),
                    benchlib.spread([x["controller_cpu_s"] for x in f if "controller_cpu_s" in x]),
                    benchlib.spread([round(x["machine_cpu_s"] - x["controller_cpu_s"], 1)
                                     for x in f if "controller_cpu_s" in x]),
                    f"{min(loads):g}-{max(loads):g}"])
    print(benchlib.table(["hosts", "site.yml", "settings", "wall s", "changed tasks", "failed runs",
                          "controller CPU s", "hosts CPU s", "load 1m"], out))
    print()
    for line in rows:
        if line["params"]["stage"] == "first run":
            slow = ", ".join(f"{task} {t:g} s" for task, t in line["figures"]["slowest_tasks"][:3])
            print(f"- {line['params']['hosts']} hosts, first run: hosts up in {line['figures']['hosts_up_s']} s; "
                  f"slowest tasks: {slow}")

if __name__ == "__main__":
    main()

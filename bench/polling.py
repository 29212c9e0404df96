"""Benchmark train.yml's wait for a job: thousands of polls, the controller's memory and the time per poll.

Runs the dgl_job role's wait.yml (the one `until` task that polls `dglkit watch`, and the kit's callback that
prints a progress line per poll) against a job directory on this machine whose status and metrics a thread
keeps changing, over Ansible's local connection, so nothing but the controller's own cost is measured. For
each poll line the script samples the RSS of ansible-playbook's main process and of its whole process tree;
after --polls lines (or --max-minutes) it marks the job succeeded and the loop ends. Appends to
bench/results/polling.jsonl, with the memory and time per poll of each tenth of the run.

    .venv/bin/python bench/polling.py --polls 2000 [--max-minutes 60]
    .venv/bin/python bench/polling.py --quick
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil

import benchlib
from dglkit.common import write_json

PLAYBOOK = """
- name: Poll a job
  hosts: storage
  gather_facts: false
  tasks:
    - name: Wait for the job
      ansible.builtin.include_role:
        name: dgl_job
        tasks_from: wait
"""


def fake_job(job_dir: Path, nodes: list[str], stop: threading.Event) -> None:
    """Nodes that report running and a rank 0 that finishes an epoch every 50 ms, until `stop`."""
    epoch = 0
    with open(job_dir / "metrics.jsonl", "a") as metrics:
        while not stop.is_set():
            for node in nodes:
                write_json(job_dir / "nodes" / node / "status.json", {"node": node, "state": "running", "attempt": 1,
                                                                       "updated": time.time(), "processes": []})
            metrics.write(json.dumps({"event": "epoch", "epoch": epoch, "loss": 1.0 / (epoch + 1), "train_acc": 0.5,
                                      "val_acc": 0.5, "epoch_time": 0.05, "seeds_per_s": 1000.0}) + "\n")
            metrics.flush()
            epoch += 1
            stop.wait(0.05)
    for node in nodes:
        write_json(job_dir / "nodes" / node / "status.json", {"node": node, "state": "succeeded", "attempt": 1,
                                                               "updated": time.time(), "processes": []})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=4, help="worker nodes the job reports")
    parser.add_argument("--max-minutes", type=float, help="end the run after this long even if fewer polls were "
                        "made (the figures then say how many)")
    benchlib.add_common_arguments(parser, "100 polls")
    args = benchlib.parse(parser, "polling", print_table)
    if args is None:
        return
    if args.quick:
        args.polls = 100
    nodes = [f"node{i}" for i in range(2, args.nodes + 2)]
    with tempfile.TemporaryDirectory(prefix="dglkit-polling-") as tmp:
        job_dir = Path(tmp) / "job"
        for node in nodes:
            (job_dir / "nodes" / node).mkdir(parents=True)
        (job_dir / "job.json").write_text(json.dumps({"max_restarts": 0, "train_args": ["--num-epochs", "100000"]}))
        (Path(tmp) / "inventory.yml").write_text(json.dumps({"all": {"children": {"storage": {"hosts": {
            "localhost": {"ansible_connection": "local", "ansible_python_interpreter": benchlib.PYTHON}}}}}}))
        (Path(tmp) / "poll.yml").write_text(PLAYBOOK)
        extra = {"__dgl_job_dir": str(job_dir), "__dgl_job_nodes": nodes, "dgl_job_venv": str(benchlib.REPO / ".venv"),
                 "__dgl_job_storage_host": "localhost", "__dgl_job_job_id": "bench", "dgl_job_poll_seconds": 0,
                 "dgl_job_progress_seconds": 0,
                 # The watch runs as this user: there is no job account on the controller (a variable beats the
                 # task's `become: true`).
                 "ansible_become": False}
        stop = threading.Event()
        writer = threading.Thread(target=fake_job, args=(job_dir, nodes, stop))
        writer.start()
        env = {**os.environ, "ANSIBLE_CONFIG": str(benchlib.REPO / "ansible.cfg"),
               "ANSIBLE_ROLES_PATH": str(benchlib.REPO / "roles"), "ANSIBLE_NOCOLOR": "1",
               "PYTHONPATH": str(benchlib.REPO / "app")}
        cmd = [str(benchlib.REPO / ".venv/bin/ansible-playbook"), "-i", str(Path(tmp) / "inventory.yml"),
               str(Path(tmp) / "poll.yml"), "-e", json.dumps(extra)]
        samples = []  # (seconds since start, main RSS MiB, tree RSS MiB)
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=benchlib.REPO)
        try:
            main_proc = psutil.Process(proc.pid)
            for line in proc.stdout:
                if "running: epoch" not in line:
                    continue
                tree = benchlib.tree_rss(proc.pid)
                samples.append((time.monotonic() - start, main_proc.memory_info().rss / 2**20, tree / 2**20))
                if len(samples) == args.polls or (args.max_minutes and samples[-1][0] > 60 * args.max_minutes):
                    stop.set()
        finally:
            stop.set()
            writer.join()
            proc.wait()
    assert proc.returncode == 0 and samples, f"ansible-playbook exited {proc.returncode}"
    gaps = [b[0] - a[0] for a, b in zip(samples, samples[1:])]
    tenth = max(len(samples) // 10, 1)
    first, last = samples[:tenth], samples[-tenth:]
    figures = {
        "polls": len(samples),
        "polls_per_min": round(60 * (len(samples) - 1) / max(samples[-1][0] - samples[0][0], 1e-9), 1),
        # Per tenth of the run, in order: flat lists are flat memory and time per poll.
        "main_rss_mb_tenths": [round(statistics.fmean(s[1] for s in samples[i:i + tenth]), 1)
                               for i in range(0, tenth * 10, tenth) if samples[i:i + tenth]],
        "poll_s_tenths": [round(statistics.fmean(gaps[i:i + tenth]), 3)
                          for i in range(0, tenth * 10, tenth) if gaps[i:i + tenth]],
        "main_rss_mb_first_tenth": round(statistics.fmean(s[1] for s in first), 1),
        "main_rss_mb_last_tenth": round(statistics.fmean(s[1] for s in last), 1),
        "main_rss_mb_max": round(max(s[1] for s in samples), 1),
        "tree_rss_mb_first_tenth": round(statistics.fmean(s[2] for s in first), 1),
        "tree_rss_mb_last_tenth": round(statistics.fmean(s[2] for s in last), 1),
        "poll_s_first_tenth": round(statistics.fmean(gaps[:tenth]), 3),
        "poll_s_last_tenth": round(statistics.fmean(gaps[-tenth:]), 3),
        "poll_s_median": round(statistics.median(gaps), 3),
        "wall_s": round(samples[-1][0], 1),
    }
    benchlib.report("polling", {"polls": args.polls, "nodes": args.nodes, "max_minutes": args.max_minutes}, figures)


def print_table(records: list[dict]) -> None:
    rows = [[r["figures"]["polls"], r["params"]["nodes"], r["figures"]["main_rss_mb_first_tenth"],
             r["figures"]["main_rss_mb_last_tenth"], r["figures"]["tree_rss_mb_first_tenth"],
             r["figures"]["tree_rss_mb_last_tenth"], r["figures"]["poll_s_first_tenth"],
             r["figures"]["poll_s_last_tenth"], r["figures"]["wall_s"]] for r in records]
    print(benchlib.table(["polls", "nodes", "main RSS first 10%, MiB", "main RSS last 10%, MiB",
                          "tree RSS first 10%, MiB", "tree RSS last 10%, MiB", "poll first 10%, s",
                          "poll last 10%, s", "wall, s"], rows))


if __name__ == "__main__":
    main()

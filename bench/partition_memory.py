"""Where `dglkit partition`'s memory goes: runs it once on a prepared dataset, samples the resident memory of
its process tree every 20 ms and splits the run at the progress lines DGL and the kit print, so that each
stage shows the memory it started from and the peak it reached, in MB and in bytes per edge.
Appends to bench/results/partition_memory.jsonl.

    .venv/bin/python bench/partition_memory.py --dataset-dir /var/tmp/dglkit-part/data-1M --builder dgl
    .venv/bin/python bench/partition_memory.py --dataset-dir /var/tmp/dglkit-part/data-1M --builder lean
    .venv/bin/python bench/partition_memory.py --dataset-dir DIR --builder distributed   # prepared --arrays

--builder distributed runs its steps one after the other here (assign, part 0 .. N-1, finish): each step's
peak is what one host of a cluster would hold.
"""

import argparse
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import benchlib


def sampled(cmd: list[str], num_edges: int, label: str) -> tuple[list[dict], int, int]:
    """Run cmd, sampling its process tree's resident memory; return its stages (each ending with a progress
    line, prefixed with `label`), exit code and peak bytes."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=benchlib.APP_ENV)
    samples: list[tuple[float, int]] = []

    def sample() -> None:
        while proc.poll() is None:
            samples.append((time.monotonic() - start, benchlib.tree_rss(proc.pid)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    marks = [(0.0, "start")]
    for line in proc.stdout:
        marks.append((time.monotonic() - start, line.strip()[:110]))
    proc.wait()
    sampler.join()
    marks.append((time.monotonic() - start, "exit"))
    # DGL's and the kit's lines report a stage's end ("... takes 3.1 s"): a stage is named by the line ending it.
    stages = []
    for (begin, _), (end, name) in zip(marks, marks[1:]):
        inside = [rss for t, rss in samples if begin <= t <= end]
        if inside:
            stages.append({"ends_with": f"{label}: {name}" if label else name, "t_s": round(end, 2),
                           "peak_mb": round(max(inside) / 2**20), "peak_bytes_per_edge": round(max(inside) / num_edges, 1)})
    return stages, proc.returncode, max((rss for _, rss in samples), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset-dir", required=True, type=Path)
    parser.add_argument("--num-parts", type=int, default=2)
    parser.add_argument("--builder", choices=("dgl", "lean", "distributed"), default="dgl")
    parser.add_argument("--out", type=Path, default=Path("/var/tmp/dglkit-bench/partition-memory"))
    args = parser.parse_args()
    num_edges = json.loads((args.dataset_dir / "dataset.json").read_text())["num_edges"]
    shutil.rmtree(args.out, ignore_errors=True)
    cmd = [benchlib.PYTHON, "-u", "-m", "dglkit", "partition", "--dataset-dir", str(args.dataset_dir),
           "--out", str(args.out), "--num-parts", str(args.num_parts), "--builder", args.builder,
           "--memory-gb", "0"]
    steps = ([["--step", "assign"], *(["--step", "part", "--part", str(p)] for p in range(args.num_parts)),
              ["--step", "finish"]] if args.builder == "distributed" else [[]])
    stages, returncode, peak = [], 0, 0
    for step in steps:
        step_stages, returncode, step_peak = sampled(cmd + step, num_edges, " ".join(step))
        stages += step_stages
        peak = max(peak, step_peak)
        if returncode:
            break
    for stage in stages:
        print(f"{stage['t_s']:8.2f} s  peak {stage['peak_mb']:6d} MB  {stage['peak_bytes_per_edge']:6.1f} B/edge"
              f"  until: {stage['ends_with']}")
    benchlib.append("partition_memory", {
        "params": {"dataset": str(args.dataset_dir), "num_edges": num_edges, "num_parts": args.num_parts,
                   "builder": args.builder},
        "figures": {"returncode": returncode, "stages": stages, "peak_mb": round(peak / 2**20)}})
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()

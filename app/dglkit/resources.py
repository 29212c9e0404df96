"""Memory and disk estimates for `prepare` and `partition`, and the check that refuses a run the host
cannot hold, before anything is written.

The per-edge and per-node figures are peak resident memory measured with bench/partition.py and
bench/partition_memory.py on synthetic graphs of 2.4M to 123.7M edges (BENCHMARKS.md), rounded up.
"""

import os
import shutil
from pathlib import Path

from dglkit.common import UserError

GB = 2**30
# Python with torch and dgl imported.
BASE = 0.6 * GB
# Peak bytes per directed edge of the graph (features aside). "assign" and "part" are the steps of
# `partition --builder distributed`: METIS on the structure on one host, one part per worker.
PER_EDGE = {"prepare": 20, "lean": 60, "dgl": 215, "assign": 60, "part": 30}
# Times the node data (features, labels, masks) is held at once (prepare draws the features and adds the
# class centres in place).
FEATURE_COPIES = {"prepare": 2, "lean": 1.2, "dgl": 2, "assign": 1, "part": 1.2}
# Parts are balanced to within 3% in nodes (BENCHMARKS.md): a part's share of the nodes, with room.
PART_SHARE = 1.1
# The lean builder's parent process after METIS: the graph's structure (src, dst, each edge's part) ...
LEAN_GRAPH_PER_EDGE = 24
# ... and, for each part it is building (`builders` at once), times that part's node data is held (gathered,
# then written) and bytes per edge of that part. Two graphs fix the two: 160k nodes x 2048 features, 1.5M edges
# (tests/e2e/test_mpi_partition.py's: 3.0 GB with one builder, 4.2 GB with two, so 1.75 copies) and products-dgl
# (9410 MB with two builders, so 24 bytes per edge with 1.8 copies); both rounded up.
LEAN_PART_FEATURE_COPIES = 1.8
LEAN_PART_PER_EDGE = 30


def memory_estimate(stage: str, num_nodes: int, num_edges: int, feat_dim: int, num_parts: int = 1,
                    builders: int = 1) -> int:
    """Peak bytes of `prepare` (stage "prepare"), `partition --builder lean|dgl` (lean: building `builders`
    parts at once), or a step of `partition --builder distributed`: "assign" (the storage host) and "part"
    (each worker, for num_parts)."""
    node_bytes: float = num_nodes * (4 * feat_dim + 11)  # float32 features, int64 labels, three masks
    if stage == "assign":  # no node data: vertex weights and METIS' own arrays
        node_bytes = 40 * num_nodes
    elif stage == "part":  # this part's rows only, and the node ID maps
        node_bytes = node_bytes * min(1.0, PART_SHARE / num_parts) + 40 * num_nodes
    peak = BASE + PER_EDGE[stage] * num_edges + FEATURE_COPIES[stage] * node_bytes
    if stage == "lean":  # the METIS child, or the parent building the parts, whichever holds more
        parts = builders * (LEAN_PART_PER_EDGE * num_edges + LEAN_PART_FEATURE_COPIES * node_bytes) * PART_SHARE / num_parts
        peak = max(peak, BASE + LEAN_GRAPH_PER_EDGE * num_edges + node_bytes + parts)
    return int(peak)


# `dglkit mpi` (the mpi builder), per rank: peak bytes per listed edge of its share of the graph, the larger of
# the assignment's (PT-Scotch's) and the build's, over the imports (bench/mpipart.py, BENCHMARKS.md §11). The
# assignment takes each edge in both directions: a graph that lists one direction per edge (a citation graph:
# ogbn-papers100M) measured 245 bytes per listed edge on 1M nodes, one that lists both 130; the estimate takes the
# first, since the listing does not say which it is.
MPI_PER_SHARE_EDGE = 250
# Times a rank holds its part's node data at once (read, then written as DGL tensors): 1.7 measured by the
# rank's peak on 160k nodes x 2048 features, 2 workers (tests/e2e/test_mpi_partition.py), rounded up.
MPI_FEATURE_COPIES = 1.8
# Times a rank holds its part's edge data at once: as words in its in-edges' rows, then as the arrays it writes
# (from the build's steps, not measured).
MPI_EDGE_DATA_COPIES = 2


def mpi_rank_estimate(num_nodes: int, num_edges: int, feat_dim: int, ranks: int, edge_words: int = 0) -> int:
    """Peak bytes of one rank of the mpi builder on `ranks` workers: its share of the edges, its part's node
    data, its share of the node ID tables and its part's edge data (edge_words int64 words per edge, as they
    travel: dglkit.mpibuild.edge_words)."""
    share = PART_SHARE / ranks
    node_bytes = num_nodes * (4 * feat_dim + 11 + 40) * share
    edge_data_bytes = 8 * edge_words * num_edges * share
    return int(BASE + MPI_PER_SHARE_EDGE * num_edges * share + MPI_FEATURE_COPIES * node_bytes
               + MPI_EDGE_DATA_COPIES * edge_data_bytes)


def mpi_ranks_needed(num_nodes: int, num_edges: int, feat_dim: int, have: int, edge_words: int = 0,
                     most: int = 4096) -> int | None:
    """The fewest workers whose ranks' estimate fits in `have` bytes each, or None."""
    return next((ranks for ranks in range(2, most + 1)
                 if mpi_rank_estimate(num_nodes, num_edges, feat_dim, ranks, edge_words) <= have), None)


def lean_builders(num_nodes: int, num_edges: int, feat_dim: int, num_parts: int, memory_gb: float | None) -> int:
    """Parts the lean builder builds at once: one per core, as many as the memory holds (at least one; the
    check of one builder's estimate refuses what does not fit). memory_gb as check_fits takes it."""
    have = host_memory()[0] if memory_gb is None else (memory_gb * GB if memory_gb else float("inf"))
    most = min(len(os.sched_getaffinity(0)), num_parts)
    return max([k for k in range(1, most + 1)
                if memory_estimate("lean", num_nodes, num_edges, feat_dim, num_parts, k) <= have], default=1)


# `dglkit chunked generate`, per chunk (one array in memory at a time; BENCHMARKS.md §10): numpy and pandas, then
# per node of the chunk its float32 features, 24 bytes per edge of its average degree (int64 ends and their
# temporaries) and its labels and masks. 324 MB estimated against 305 measured for 250k nodes of degree 20 and 100
# features, 776 against 728 for 80k nodes of degree 10 and 2048 features.
CHUNK_BASE = 0.1 * GB
CHUNK_PER_DEGREE = 24


def chunk_writer_estimate(chunk_nodes: int, avg_degree: float, feat_dim: int) -> tuple[int, int]:
    """(peak memory bytes, bytes on disk) of writing one chunk of the synthetic graphs (of the heterogeneous one,
    `chunk_nodes` papers, whose features and citations are its largest arrays)."""
    memory = CHUNK_BASE + chunk_nodes * (4 * feat_dim + CHUNK_PER_DEGREE * avg_degree + 16)
    return int(memory), int(chunk_nodes * (4 * feat_dim + 16 * avg_degree + 11))


# A training node (`dglkit launch`): its main server reads its part's node data and copies it into shared memory
# (DGL's server: both are alive until the copy ends), and holds the part's structure there; every other process
# (backup servers, trainers, samplers) holds the imports and its mini-batches. 2.4 GB estimated against 2.5 GB
# measured (its working set, file cache included) for a 0.7 GB part, one trainer (tests/e2e/test_mpi_partition.py).
TRAINING_NODE_DATA_COPIES = 2
TRAINING_PROCESS = 0.4 * GB


def training_estimate(node_data_bytes: int, graph_bytes: int, processes: int) -> int:
    """Peak bytes of one node of a training job: its part's node data and structure files' sizes, and its
    processes besides the main server."""
    return int(BASE + TRAINING_NODE_DATA_COPIES * node_data_bytes + graph_bytes + processes * TRAINING_PROCESS)


def host_memory() -> tuple[int, str]:
    """Bytes this process can still use: the kernel's MemAvailable, or less when a memory cgroup caps it
    (containers, systemd units with MemoryMax=); and how that figure was found."""
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    available, source = info["MemAvailable"], "MemAvailable"
    for limit, usage in cgroup_memory():
        if limit - usage < available:
            available, source = limit - usage, f"memory cgroup limit {limit / GB:.1f} GB, {usage / GB:.1f} GB in use"
    return max(available, 0), source


def cgroup_memory() -> list[tuple[int, int]]:
    """(limit, usage) of every memory cgroup above this process that has a limit (cgroup v2 and v1). Usage is
    the working set, as container runtimes count it: without the inactive file cache, which the kernel
    reclaims before it refuses memory (a read of the dataset would otherwise look like memory in use)."""
    found: list[tuple[int, int]] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            root, limit_file, usage_file, cache = Path("/sys/fs/cgroup"), "memory.max", "memory.current", "inactive_file"
            if not (root / "cgroup.controllers").is_file():
                root = Path("/sys/fs/cgroup/unified")
        elif "memory" in controllers.split(","):
            root = Path("/sys/fs/cgroup/memory")
            limit_file, usage_file, cache = "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
        else:
            continue
        directory = root / path.lstrip("/")
        while True:
            try:
                limit = (directory / limit_file).read_text().strip()
                usage = int((directory / usage_file).read_text())
                stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
            except (OSError, ValueError):
                limit = "max"
            if limit != "max" and int(limit) < 2**60:
                found.append((int(limit), max(usage - int(stat.get(cache, 0)), 0)))
            if directory == root:
                break
            directory = directory.parent
    return found


def check_fits(command: str, need_memory: int, need_disk: int, out: Path, memory_gb: float | None,
               ways_out: str) -> dict[str, float]:
    """Refuse (UserError) when the estimate exceeds the memory (memory_gb when given; 0 skips the check) or
    the free disk under `out`; return the figures for the manifest."""
    if memory_gb is None:
        have, source = host_memory()
    else:
        have, source = int(memory_gb * GB), "--memory-gb"
    existing = out if out.exists() else next(p for p in out.parents if p.exists())
    free_disk = shutil.disk_usage(existing).free
    figures = {"estimated_memory_gb": round(need_memory / GB, 2), "estimated_disk_gb": round(need_disk / GB, 2)}
    if memory_gb != 0 and need_memory > have:
        raise UserError(f"{command} needs about {need_memory / GB:.1f} GB of memory; this host has "
                        f"{have / GB:.1f} GB available ({source}). Ways out: {ways_out}")
    if need_disk > free_disk:
        raise UserError(f"{command} writes about {need_disk / GB:.1f} GB; {existing} has {free_disk / GB:.1f} GB "
                        "free. Free space there or give an output directory on a larger file system")
    return figures


MEMORY_HELP = ("memory this command may use, in GB (default: what the host has available, MemAvailable or a "
               "memory cgroup's limit); the command refuses to start when its estimate is larger; 0: no check")

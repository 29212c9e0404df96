"""Distributed training, run as server and as trainer: the options, the checks before DGL starts, and the
table of tasks (GraphSAGE node classification, RGCN on heterogeneous graphs, link prediction), each trained by
the one loop in dglkit.loop.

`dglkit launch` starts this module once per DGL server (DGL_ROLE=server: `initialize()` serves and exits)
and once per trainer under torchrun. Rank 0 writes metrics.jsonl, model.pt (final), model-best.pt (best
validation epoch), result.json and, on request, embeddings / predictions in original node-ID order.
"""

import argparse
import os
import random
import sys
from pathlib import Path
from types import ModuleType

import dgl
import numpy as np
import torch

from dglkit import linkpred, loop, rgcn, sage
from dglkit.common import UserError, check_machine_count, read_partition_config

# (task, heterogeneous graph?) -> the module that trains it: its check(args, config) runs before DGL starts,
# its Task is what dglkit.loop trains.
TASK_MODULES = {
    ("node_classification", False): sage,
    ("node_classification", True): rgcn,
    ("link_prediction", False): linkpred,
}
TASKS = sorted({task for task, _ in TASK_MODULES})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ip-config", required=True, help="DGL ip_config file: one '<address> <port>' per machine")
    parser.add_argument("--part-config", required=True, help="partition json written by `dglkit partition`")
    parser.add_argument("--out-dir", default=".", help="where rank 0 writes metrics, model and outputs")
    parser.add_argument("--graphbolt", action="store_true", help="sample with GraphBolt (partition must have it)")
    parser.add_argument("--task", choices=TASKS, default="node_classification",
                        help="node_classification (GraphSAGE, or RGCN on a heterogeneous graph) or link_prediction")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-hidden", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--fan-out", default="10,25", help="neighbours sampled per layer, comma separated")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--eval-batch-size", type=int, default=10000)
    parser.add_argument("--num-epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--weight-decay", type=float, default=0.0, help="L2 penalty of the Adam optimizer")
    parser.add_argument("--seed", type=int, help="seed of torch, numpy, random and DGL's samplers "
                        "(servers and trainers); default: not seeded")
    parser.add_argument("--sparse-lr", type=float, default=0.01,
                        help="RGCN: learning rate of the learnt embeddings of featureless node types")
    parser.add_argument("--num-negs", type=int, default=5, help="link prediction: negatives per positive edge")
    parser.add_argument("--eval-negs", type=int, default=100,
                        help="link prediction: negatives each held-out edge is ranked against (MRR, hits@k)")
    parser.add_argument("--log-every", type=int, default=20, help="progress line every N steps")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--save-embeddings", action="store_true", help="write embeddings.npy (all nodes)")
    parser.add_argument("--save-predictions", action="store_true", help="write predictions.npy (all nodes)")
    parser.add_argument("--checkpoint-every", type=int, default=1,
                        help="write <out-dir>/checkpoint.pt every N epochs and after the last; a run that finds "
                        "one resumes from it (0: never)")


def check_inputs(args: argparse.Namespace) -> dict:
    """Validate files and options before DGL starts anything; return the partition config."""
    part_config = Path(args.part_config)
    config = read_partition_config(part_config)
    if not Path(args.ip_config).is_file():
        raise UserError(f"ip_config {args.ip_config} not found")
    machines = [line for line in Path(args.ip_config).read_text().splitlines() if line.strip()]
    check_machine_count(part_config, config["num_parts"], args.ip_config, len(machines))
    if args.graphbolt and "part_graph_graphbolt" not in config.get("part-0", {}):
        raise UserError(f"{part_config} has no GraphBolt graph: run `dglkit partition --graphbolt` or drop --graphbolt")
    fan_out = args.fan_out.split(",")
    if len(fan_out) != args.num_layers or not all(f.strip().lstrip("-").isdigit() for f in fan_out):
        raise UserError(f"--fan-out {args.fan_out!r} needs {args.num_layers} comma-separated integers (one per layer)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no GPU: use --device cpu")
    if args.weight_decay < 0:
        raise UserError(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if args.num_epochs < 1:
        raise UserError(f"--num-epochs must be >= 1, got {args.num_epochs}")
    return config


def is_heterogeneous(config: dict) -> bool:
    """DGL's partition config lists node types; a homogeneous graph has the one type '_N'."""
    return list(config.get("ntypes", {"_N": 0})) != ["_N"]


def task_module(args: argparse.Namespace, config: dict) -> ModuleType:
    """The module that trains --task on this partition, or a UserError naming the tasks that run on it."""
    hetero = is_heterogeneous(config)
    if (args.task, hetero) not in TASK_MODULES:
        other = " or ".join(task for task, on_hetero in TASK_MODULES if on_hetero == hetero)
        raise UserError(f"{args.part_config} is a {'heterogeneous' if hetero else 'homogeneous'} graph: --task "
                        f"{args.task} does not run on it; use --task {other}")
    return TASK_MODULES[(args.task, hetero)]


def seed_everything(seed: int | None) -> None:
    """Model init, shuffling, and DGL's neighbour and negative sampling: servers run this too (they sample
    their partition's share of each neighbourhood)."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)


def redirect_trainer_output() -> None:
    """Under `dglkit launch`, each trainer (and its sampler processes) logs to <node dir>/trainer-<rank>.log."""
    log_dir = os.environ.get("DGLKIT_TRAINER_LOG_DIR")
    if log_dir and os.environ.get("DGL_ROLE") == "client" and "RANK" in os.environ:
        log = os.open(Path(log_dir) / f"trainer-{os.environ['RANK']}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)


def run(args: argparse.Namespace) -> int:
    config = check_inputs(args)
    module = task_module(args, config)
    module.check(args, config)
    redirect_trainer_output()
    seed_everything(args.seed)
    # Servers serve inside initialize() and exit there; only trainers return.
    dgl.distributed.initialize(args.ip_config, use_graphbolt=args.graphbolt)
    backend = "nccl" if args.device == "cuda" else "gloo"
    torch.distributed.init_process_group(backend)
    # No destroy_process_group(): gloo's teardown can block one rank forever while its peer already waits in
    # DGL's exit barrier (seen with torch 2.2.1); process exit releases the group.
    loop.fit(args, module.Task(args, config))
    return 0

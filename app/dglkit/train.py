"""Distributed training, run as server and as trainer: the options, the checks before DGL starts, and the
table of tasks (GraphSAGE node classification, RGCN on heterogeneous graphs, link prediction), each trained by
the one loop in dglkit.loop.

`dglkit launch` starts this module once per DGL server (DGL_ROLE=server: `initialize()` serves and exits)
and once per trainer. Rank 0 writes metrics.jsonl, model.pt (final), model-best.pt (best
validation epoch), result.json and, on request, embeddings / predictions in original node-ID order.
"""

import argparse
import importlib
import json
import random
from pathlib import Path
from types import ModuleType

import dgl
import numpy as np
import torch

from dglkit import kinds, loop
from dglkit.common import UserError, check_machine_count, read_partition_config
from dglkit.settings import SETTINGS, TRAINER, fan_out_problem, parse_fan_out

# (task, heterogeneous graph?) -> the module that trains it (the table is dglkit.kinds.TASKS): its check(args,
# config) runs before DGL starts, its Task is what dglkit.loop trains.
TASK_MODULES = {key: importlib.import_module(f"dglkit.{name}") for key, name in kinds.TASKS.items()}


class SettingsFile(argparse.Action):
    """--settings FILE: the declared training settings from FILE's "train" (job.json), as if given where
    --settings stands (options after it override them)."""

    def __call__(self, parser, namespace, path, option_string=None) -> None:
        try:
            train = json.loads(Path(path).read_text())["train"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"--settings {path}: no job settings ({error!r})")
        unknown = sorted(set(train) - {s.dest for s in TRAINER_SETTINGS})
        if unknown:
            parser.error(f"--settings {path}: unknown settings {unknown}")
        for key, value in train.items():
            setattr(namespace, key, value)
        setattr(namespace, self.dest, path)


# The job settings the trainer reads, declared in dglkit.settings (defaults, types, help).
TRAINER_SETTINGS = [s for s in SETTINGS.values() if s.reader == TRAINER]
TYPES = {"int": int, "float": float, "str": str, "list": str}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ip-config", required=True, help="DGL ip_config file: one '<address> <port>' per machine")
    parser.add_argument("--part-config", required=True, help="partition json written by `dglkit partition`")
    parser.add_argument("--out-dir", default=".", help="where rank 0 writes metrics, model and outputs")
    parser.add_argument("--settings", action=SettingsFile, metavar="JOB_JSON",
                        help="the training settings from a job.json's \"train\" (options after it override them)")
    for setting in TRAINER_SETTINGS:
        if setting.type == "bool":
            parser.add_argument(setting.option, action="store_true", help=setting.help)
        else:
            parser.add_argument(setting.option, type=TYPES[setting.type], default=setting.train_value(setting.default),
                                choices=setting.choices or None, help=setting.help)
    parser.add_argument("--eval-batch-size", type=int, default=10000)
    parser.add_argument("--log-every", type=int, default=20, help="progress line every N steps")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")


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
    check_settings(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no GPU: use --device cpu")
    return config


def check_settings(args: argparse.Namespace) -> None:
    """The declared settings' checks (dglkit.settings), as `dglkit plan` applies them on the controller."""
    try:
        problem = fan_out_problem(parse_fan_out(args.fan_out), args.num_layers)
    except ValueError:
        problem = "use comma-separated integers"
    if problem:
        raise UserError(f"--fan-out {args.fan_out}: {problem} (--num-layers {args.num_layers})")
    for setting in TRAINER_SETTINGS:
        problem = setting.problem(getattr(args, setting.dest))
        if problem:
            raise UserError(f"{setting.option} {getattr(args, setting.dest)}: {problem}")


def task_module(args: argparse.Namespace, config: dict) -> ModuleType:
    """The module that trains --task on this partition, or a UserError naming the tasks that run on it."""
    error = kinds.task_error(args.task, config, args.part_config)
    if error:
        raise UserError(error)
    return TASK_MODULES[(args.task, kinds.partition_heterogeneous(config))]


def seed_everything(seed: int | None) -> None:
    """Model init, shuffling, and DGL's neighbour and negative sampling: servers run this too (they sample
    their partition's share of each neighbourhood)."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)


def run(args: argparse.Namespace) -> int:
    config = check_inputs(args)
    module = task_module(args, config)
    module.check(args, config)
    seed_everything(args.seed)
    # Servers serve inside initialize() and exit there; only trainers return.
    dgl.distributed.initialize(args.ip_config, use_graphbolt=args.graphbolt)
    backend = "nccl" if args.device == "cuda" else "gloo"
    torch.distributed.init_process_group(backend)
    # No destroy_process_group(): gloo's teardown can block one rank forever while its peer already waits in
    # DGL's exit barrier (seen with torch 2.2.1); process exit releases the group.
    loop.fit(args, module.Task(args, config))
    return 0

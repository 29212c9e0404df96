"""Distributed training, run as server and as trainer: GraphSAGE node classification (DGL's tutorial
trainer) here; --task link_prediction (dglkit.linkpred) and heterogeneous graphs (dglkit.rgcn) dispatch.

`dglkit launch` starts this module once per DGL server (DGL_ROLE=server: `initialize()` serves and exits)
and once per trainer under torchrun. Rank 0 writes metrics.jsonl, model.pt (final), model-best.pt (best
validation epoch), result.json and, on request, embeddings.npy / predictions.npy in original node-ID order
(from the best model).
"""

import argparse
import copy
import json
import os
import random
import sys
import time
from pathlib import Path

import dgl
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dglkit import checkpoint
from dglkit.common import UserError, beat, check_machine_count, read_partition_config


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


TASKS = ("node_classification", "link_prediction")


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
    return config


def is_heterogeneous(config: dict) -> bool:
    """DGL's partition config lists node types; a homogeneous graph has the one type '_N'."""
    return list(config.get("ntypes", {"_N": 0})) != ["_N"]


def seed_everything(seed: int | None) -> None:
    """Model init, shuffling, and DGL's neighbour and negative sampling: servers run this too (they sample
    their partition's share of each neighbourhood)."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)


class DistSAGE(nn.Module):
    """GraphSAGE ('mean') over sampled blocks, with DGL's layer-wise full-graph inference."""

    def __init__(self, in_feats: int, num_hidden: int, num_classes: int, num_layers: int, dropout: float):
        super().__init__()
        sizes = [in_feats] + [num_hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(dgl.nn.SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: list, x: torch.Tensor) -> torch.Tensor:
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            x = layer(block, x)
            if i < len(self.layers) - 1:
                x = self.dropout(F.relu(x))
        return x

    def inference(self, g, batch_size: int, device: torch.device) -> tuple:
        """Every layer over all nodes (one hop at a time, each trainer its share), as DGL's dist example does.

        Returns DistTensors (last hidden layer, logits); the last hidden layer is the input features when
        there is only one layer.
        """
        # node_split takes a mask: DGL's example passes np.arange(N), a mask without node 0.
        every_node = torch.ones(g.num_nodes(), dtype=torch.bool)
        nodes = dgl.distributed.node_split(every_node, g.get_partition_book(), force_even=True)
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
        x = hidden = g.ndata["feat"]
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            y = dgl.distributed.DistTensor((g.num_nodes(), layer._out_feats), torch.float32,
                                           f"dglkit_layer{i}", persistent=True)
            loader = dgl.dataloading.DistNodeDataLoader(g, nodes, sampler, batch_size=batch_size, shuffle=False)
            with torch.no_grad():
                for input_nodes, seeds, blocks in loader:
                    beat()
                    block = blocks[0].to(device)
                    h = layer(block, x[input_nodes].to(device))
                    y[seeds] = (h if last else F.relu(h)).cpu()
            g.barrier()
            hidden, x = x, y
        return hidden, x


def to_original_order(values: np.ndarray, orig_nids: np.ndarray) -> np.ndarray:
    """Row i of `values` belongs to partitioned node i, which is original node orig_nids[i]."""
    if len(values) != len(orig_nids):
        raise UserError(f"orig_nids.npy has {len(orig_nids)} rows but the graph has {len(values)} nodes: "
                        "it belongs to another partition; re-run `dglkit partition`")
    ordered = np.empty_like(values)
    ordered[orig_nids] = values
    return ordered


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
    if args.task == "link_prediction":
        from dglkit.linkpred import check_linkpred as check_task, train_linkpred as train_task
    elif is_heterogeneous(config):
        from dglkit.rgcn import check_rgcn as check_task, train_rgcn as train_task
    else:
        check_task, train_task = check_sage, train
    check_task(args, config)
    redirect_trainer_output()
    seed_everything(args.seed)
    # Servers serve inside initialize() and exit there; only trainers return.
    dgl.distributed.initialize(args.ip_config, use_graphbolt=args.graphbolt)
    backend = "nccl" if args.device == "cuda" else "gloo"
    torch.distributed.init_process_group(backend)
    # No destroy_process_group(): gloo's teardown can block one rank forever while its peer already waits in
    # DGL's exit barrier (seen with torch 2.2.1); process exit releases the group.
    train_task(args, config)
    return 0


def check_sage(args: argparse.Namespace, config: dict) -> None:
    if (args.save_embeddings or args.save_predictions) and not (Path(args.part_config).parent / "orig_nids.npy").is_file():
        raise UserError(f"{Path(args.part_config).parent}/orig_nids.npy not found: outputs cannot be put back in "
                        "original node order; re-run `dglkit partition`")


def train(args: argparse.Namespace, config: dict) -> None:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if args.device == "cuda" else "cpu")
    g = dgl.distributed.DistGraph(config["graph_name"], part_config=args.part_config)
    book = g.get_partition_book()
    train_nids = dgl.distributed.node_split(g.ndata["train_mask"], book, force_even=True)
    val_nids = dgl.distributed.node_split(g.ndata["val_mask"], book, force_even=True)
    test_nids = dgl.distributed.node_split(g.ndata["test_mask"], book, force_even=True)
    num_classes = int(torch.max(g.ndata["labels"][0 : g.num_nodes()])) + 1
    in_feats = g.ndata["feat"].shape[1]
    log(rank, f"graph {config['graph_name']}: {g.num_nodes()} nodes, {in_feats} features, {num_classes} classes; "
        f"this trainer: {len(train_nids)} train, {len(val_nids)} val, {len(test_nids)} test nodes")

    model = DistSAGE(in_feats, args.num_hidden, num_classes, args.num_layers, args.dropout).to(device)
    model = DistributedDataParallel(model, device_ids=[device] if args.device == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sampler = dgl.dataloading.MultiLayerNeighborSampler([int(f) for f in args.fan_out.split(",")])
    train_loader = dgl.dataloading.DistNodeDataLoader(
        g, train_nids, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False)

    out_dir = Path(args.out_dir)
    first_epoch, history, best = (checkpoint.load(out_dir, model.module, optimizer) if args.checkpoint_every
                                  else (0, [], None))
    best = best or {"val_acc": -1.0, "epoch": None, "state": None}
    metrics = open_metrics(args, world) if rank == 0 else None
    if metrics:
        if first_epoch:
            # Kept in the history, so that the summary can count every restart and the time it cost.
            history.append({"event": "resume", "epoch": first_epoch, "time": time.time()})
            log(rank, f"resumed from {out_dir / checkpoint.NAME} at epoch {first_epoch}")
        # A resumed run rewrites the curves up to its checkpoint, so they continue without the lost epochs.
        for record in history:
            write_event(metrics, record)

    val_acc = next((record["val_acc"] for record in reversed(history) if record["event"] == "epoch"), 0.0)
    for epoch in range(first_epoch, args.num_epochs):
        model.train()
        start = time.time()
        # loss sum, correct, seeds: summed over all trainers below.
        totals = torch.zeros(3, dtype=torch.float64)
        # join() keeps DDP's all-reduce from hanging when trainers have different numbers of batches.
        with model.join():
            for step, (input_nodes, seeds, blocks) in enumerate(train_loader):
                beat()
                blocks = [block.to(device) for block in blocks]
                x = g.ndata["feat"][input_nodes].to(device)
                y = g.ndata["labels"][seeds].long().to(device)
                logits = model(blocks, x)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                totals += torch.tensor([loss.item() * len(seeds), (logits.argmax(1) == y).sum().item(), len(seeds)],
                                       dtype=torch.float64)
                if step % args.log_every == 0:
                    log(rank, f"epoch {epoch} step {step} loss {loss.item():.4f} seeds {len(seeds)}")
        epoch_time = torch.tensor([time.time() - start], dtype=torch.float64)
        torch.distributed.all_reduce(totals)
        torch.distributed.all_reduce(epoch_time, op=torch.distributed.ReduceOp.MAX)
        val_acc = evaluate(model.module, g, val_nids, sampler, args.eval_batch_size, device)
        # val_acc is all-reduced, so every trainer keeps the same epoch's (identical, DDP-synchronised) weights.
        if val_acc > best["val_acc"]:
            best = {"val_acc": val_acc, "epoch": epoch, "state": copy.deepcopy(model.module.state_dict())}
        loss_sum, correct, seeds = totals.tolist()
        record = {"event": "epoch", "epoch": epoch, "loss": loss_sum / max(seeds, 1),
                  "train_acc": correct / max(seeds, 1), "val_acc": val_acc, "epoch_time": epoch_time.item(),
                  "seeds_per_s": seeds / epoch_time.item(), "num_trainers": world, "time": time.time()}
        log_epoch(rank, record)
        history.append(record)
        if metrics:
            write_event(metrics, record)
        if args.checkpoint_every and ((epoch + 1) % args.checkpoint_every == 0 or epoch + 1 == args.num_epochs):
            checkpoint.save(out_dir, model.module, optimizer, epoch, history, best)

    test_acc = evaluate(model.module, g, test_nids, sampler, args.eval_batch_size, device)
    final_state = model.module.state_dict()
    model.module.load_state_dict(best["state"])
    best_test_acc = evaluate(model.module, g, test_nids, sampler, args.eval_batch_size, device)
    log(rank, f"test_acc {test_acc:.4f} (final model), {best_test_acc:.4f} (best validation model, epoch "
        f"{best['epoch']}, val_acc {best['val_acc']:.4f})")
    if args.save_embeddings or args.save_predictions:
        save_outputs(args, model.module, g, device, rank)
    if metrics:
        test = {"test_acc": test_acc, "val_acc": val_acc, "best_test_acc": best_test_acc,
                "best_val_acc": best["val_acc"], "best_epoch": best["epoch"]}
        write_event(metrics, {"event": "test", **test})
        metrics.close()
        beat()
        torch.save(final_state, out_dir / "model.pt")
        torch.save(best["state"], out_dir / "model-best.pt")
        write_result(args, {**test, "num_trainers": world, "num_classes": num_classes, "in_feats": in_feats,
                            "graph_name": config["graph_name"]})


def open_metrics(args: argparse.Namespace, world: int):
    """Rank 0's metrics.jsonl, opened with the start event (every option of the run)."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = (out_dir / "metrics.jsonl").open("w")
    options = {key: value for key, value in vars(args).items() if key not in ("subcommand", "run")}
    write_event(metrics, {"event": "start", **options, "num_trainers": world})
    return metrics


def write_result(args: argparse.Namespace, result: dict) -> None:
    result = {"task": args.task, "num_epochs": args.num_epochs, "num_hidden": args.num_hidden,
              "num_layers": args.num_layers, "seed": args.seed, "weight_decay": args.weight_decay, **result}
    (Path(args.out_dir) / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def log_epoch(rank: int, record: dict) -> None:
    """One progress line per epoch: every numeric figure of the epoch event."""
    figures = " ".join(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
                       for key, value in record.items() if key not in ("event", "epoch", "num_trainers", "time"))
    log(rank, f"epoch {record['epoch']}: {figures}")


def evaluate(model, g, nids, sampler, batch_size: int, device) -> float:
    """Accuracy on `nids` over all trainers (each passes its own split), with sampled neighbourhoods."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)
    loader = dgl.dataloading.DistNodeDataLoader(g, nids, sampler, batch_size=batch_size, shuffle=False)
    with torch.no_grad():
        for input_nodes, seeds, blocks in loader:
            beat()
            blocks = [block.to(device) for block in blocks]
            logits = model(blocks, g.ndata["feat"][input_nodes].to(device))
            labels = g.ndata["labels"][seeds].long().to(device)
            counts += torch.tensor([(logits.argmax(1) == labels).sum().item(), len(seeds)], dtype=torch.float64)
    torch.distributed.all_reduce(counts)
    return counts[0].item() / max(counts[1].item(), 1)


def save_outputs(args: argparse.Namespace, model, g, device, rank: int) -> None:
    """Full-graph layer-wise inference shared by all trainers; rank 0 writes it in original node order."""
    embeddings, logits = model.inference(g, args.eval_batch_size, device)
    if rank != 0:
        return
    orig_nids = np.load(Path(args.part_config).parent / "orig_nids.npy")
    out_dir = Path(args.out_dir)
    if args.save_embeddings:
        np.save(out_dir / "embeddings.npy", to_original_order(embeddings[0 : g.num_nodes()].numpy(), orig_nids))
    if args.save_predictions:
        predictions = logits[0 : g.num_nodes()].argmax(1).numpy()
        np.save(out_dir / "predictions.npy", to_original_order(predictions, orig_nids))


def log(rank: int, message: str) -> None:
    print(f"[rank {rank}] {time.strftime('%H:%M:%S')} {message}", flush=True)


def write_event(stream, record: dict) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()

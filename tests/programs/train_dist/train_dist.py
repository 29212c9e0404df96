"""Distributed GraphSAGE node classification written the way DGL's distributed examples are: started by DGL's
tools/launch.py (or the kit) once per server and once per trainer (launch.py: through torchrun). It imports nothing of
the kit; it needs `tabulate`, which the node environment does not have (requirements.txt). Like DGL's examples
it reads the node data `features`, `labels` and the masks (the kit stores `feat`: dgl_job_node_data_names, or
--features feat).

Test switches: --quiet_seconds (train without printing anything for that long), --crash_rank/--crash_epoch
(one trainer raises). --output_dir receives metrics.jsonl in the kit's format and result.json.
"""
import argparse
import json
import os
import socket
import time

import dgl
import torch as th
import torch.nn as nn
import torch.nn.functional as F
from tabulate import tabulate


class SAGE(nn.Module):
    def __init__(self, in_feats, n_hidden, n_classes):
        super().__init__()
        self.layers = nn.ModuleList([dgl.nn.SAGEConv(in_feats, n_hidden, "mean"),
                                     dgl.nn.SAGEConv(n_hidden, n_classes, "mean")])

    def forward(self, blocks, x):
        h = F.relu(self.layers[0](blocks[0], x))
        return self.layers[1](blocks[1], h)


def accuracy(model, g, features, nids, sampler, batch_size):
    """Correct predictions and seeds over all trainers."""
    model.eval()
    counts = th.zeros(2, dtype=th.float64)
    loader = dgl.dataloading.DistNodeDataLoader(g, nids, sampler, batch_size=batch_size, shuffle=False)
    with th.no_grad():
        for input_nodes, seeds, blocks in loader:
            pred = model(blocks, g.ndata[features][input_nodes]).argmax(1)
            counts += th.tensor([(pred == g.ndata["labels"][seeds].long()).sum().item(), len(seeds)],
                                dtype=th.float64)
    th.distributed.all_reduce(counts)
    model.train()
    return counts[0].item() / max(counts[1].item(), 1)


def main(args):
    print(f"{socket.gethostname()}: initializing DistDGL", flush=True)
    dgl.distributed.initialize(args.ip_config)
    th.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
    rank = g.rank()
    pb = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    val_nid = dgl.distributed.node_split(g.ndata["val_mask"], pb, force_even=True)
    test_nid = dgl.distributed.node_split(g.ndata["test_mask"], pb, force_even=True)
    n_classes = int(g.ndata["labels"][0:g.num_nodes()].max()) + 1
    sampler = dgl.dataloading.NeighborSampler([int(f) for f in args.fan_out.split(",")])
    loader = dgl.dataloading.DistNodeDataLoader(g, train_nid, sampler, batch_size=args.batch_size, shuffle=True)
    model = th.nn.parallel.DistributedDataParallel(SAGE(g.ndata[args.features].shape[1], args.num_hidden, n_classes))
    optimizer = th.optim.Adam(model.parameters(), lr=args.lr)
    metrics = None
    if rank == 0 and args.output_dir:
        metrics = open(os.path.join(args.output_dir, "metrics.jsonl"), "w")
        metrics.write(json.dumps({"event": "start", "num_epochs": args.num_epochs, "part_config": args.part_config,
                                  "num_trainers": th.distributed.get_world_size()}) + "\n")

    rows = []
    for epoch in range(args.num_epochs):
        tic = time.time()
        totals = th.zeros(3, dtype=th.float64)
        with model.join():
            for step, (input_nodes, seeds, blocks) in enumerate(loader):
                if rank == args.crash_rank and epoch == args.crash_epoch and step == 2:
                    raise RuntimeError(f"injected crash on rank {rank} in epoch {epoch}")
                x = g.ndata[args.features][input_nodes]
                y = g.ndata["labels"][seeds].long()
                pred = model(blocks, x)
                loss = F.cross_entropy(pred, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                totals += th.tensor([loss.item() * len(seeds), (pred.argmax(1) == y).sum().item(), len(seeds)],
                                    dtype=th.float64)
        if epoch == 0 and args.quiet_seconds:
            time.sleep(args.quiet_seconds)
        th.distributed.all_reduce(totals)
        val_acc = accuracy(model.module, g, args.features, val_nid, sampler, args.batch_size)
        epoch_time = time.time() - tic
        record = {"event": "epoch", "epoch": epoch, "time": time.time(), "loss": totals[0].item() / totals[2].item(),
                  "train_acc": totals[1].item() / totals[2].item(), "val_acc": val_acc, "epoch_time": epoch_time,
                  "seeds_per_s": totals[2].item() / epoch_time}
        rows.append([epoch, record["loss"], record["val_acc"]])
        if not args.quiet_seconds:
            print(f"Part {rank} | Epoch {epoch:05d} | Loss {record['loss']:.4f} | Val Acc {val_acc:.4f}", flush=True)
        if metrics:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
    test_acc = accuracy(model.module, g, args.features, test_nid, sampler, args.batch_size)
    print(tabulate(rows, headers=["epoch", "loss", "val_acc"], floatfmt=".4f"), flush=True)
    print(f"Part {rank} | Test Acc {test_acc:.4f}", flush=True)
    if metrics:
        metrics.write(json.dumps({"event": "test", "test_acc": test_acc, "val_acc": val_acc}) + "\n")
        metrics.close()
        with open(os.path.join(args.output_dir, "result.json"), "w") as f:
            json.dump({"val_acc": val_acc, "test_acc": test_acc, "num_epochs": args.num_epochs}, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Distributed GraphSAGE (DGL example style)")
    parser.add_argument("--graph_name", type=str, help="graph name")
    parser.add_argument("--ip_config", type=str, help="the file for IP configuration")
    parser.add_argument("--part_config", type=str, help="the path to the partition config file")
    parser.add_argument("--num_epochs", type=int, default=3)
    parser.add_argument("--num_hidden", type=int, default=32)
    parser.add_argument("--fan_out", type=str, default="10,25")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--features", type=str, default="features", help="the node data name of the features")
    parser.add_argument("--output_dir", type=str, default="", help="where rank 0 writes metrics.jsonl")
    parser.add_argument("--local_rank", type=int, help="set by torch.distributed.launch; unused")
    parser.add_argument("--quiet_seconds", type=float, default=0, help="print nothing and pause after epoch 0")
    parser.add_argument("--crash_rank", type=int, default=-1, help="this trainer raises in --crash_epoch")
    parser.add_argument("--crash_epoch", type=int, default=1)
    main(parser.parse_args())

"""GraphSAGE node classification on a homogeneous DistGraph, as DGL's distributed tutorial trains it; with
--save-embeddings/--save-predictions, full-graph layer-wise inference from the best-validation model, rows in
original node order."""

import argparse
import os
from pathlib import Path
from typing import Any

import dgl
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dglkit.common import UserError, beat
from dglkit.loop import log, to_original_order
from dglkit.settings import parse_fan_out


def check(args: argparse.Namespace, config: dict) -> None:
    if (args.save_embeddings or args.save_predictions) and not (Path(args.part_config).parent / "orig_nids.npy").is_file():
        raise UserError(f"{Path(args.part_config).parent}/orig_nids.npy not found: outputs cannot be put back in "
                        "original node order; re-run `dglkit partition`")


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


class Task:
    metric = "acc"
    counts_correct = True
    tests_every_epoch = False
    sparse_optimizer = None
    embeddings: dict[str, Any] = {}

    def __init__(self, args: argparse.Namespace, config: dict):
        self.args = args
        self.device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if args.device == "cuda" else "cpu")
        self.graph_name = config["graph_name"]
        g = self.g = dgl.distributed.DistGraph(config["graph_name"], part_config=args.part_config)
        book = g.get_partition_book()
        self.nids = {name: dgl.distributed.node_split(g.ndata[f"{name}_mask"], book, force_even=True)
                     for name in ("train", "val", "test")}
        self.num_classes = int(torch.max(g.ndata["labels"][0 : g.num_nodes()])) + 1
        self.in_feats = g.ndata["feat"].shape[1]
        log(torch.distributed.get_rank(), f"graph {config['graph_name']}: {g.num_nodes()} nodes, {self.in_feats} "
            f"features, {self.num_classes} classes; this trainer: "
            + ", ".join(f"{len(ids)} {name}" for name, ids in self.nids.items()) + " nodes")
        model = DistSAGE(self.in_feats, args.num_hidden, self.num_classes, args.num_layers, args.dropout)
        self.model = DistributedDataParallel(model.to(self.device),
                                             device_ids=[self.device] if args.device == "cuda" else None)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        self.sampler = dgl.dataloading.MultiLayerNeighborSampler(parse_fan_out(args.fan_out))
        self.loader = dgl.dataloading.DistNodeDataLoader(g, self.nids["train"], self.sampler,
                                                         batch_size=args.batch_size, shuffle=True, drop_last=False)

    def step(self, batch: tuple) -> tuple[float, int, int]:
        input_nodes, seeds, blocks = batch
        blocks = [block.to(self.device) for block in blocks]
        x = self.g.ndata["feat"][input_nodes].to(self.device)
        y = self.g.ndata["labels"][seeds].long().to(self.device)
        logits = self.model(blocks, x)
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item(), (logits.argmax(1) == y).sum().item(), len(seeds)

    def evaluate(self, split: str) -> dict[str, float]:
        """Accuracy over all trainers (each passes its own share), with sampled neighbourhoods."""
        model = self.model.module
        model.eval()
        counts = torch.zeros(2, dtype=torch.float64)
        loader = dgl.dataloading.DistNodeDataLoader(self.g, self.nids[split], self.sampler,
                                                    batch_size=self.args.eval_batch_size, shuffle=False)
        with torch.no_grad():
            for input_nodes, seeds, blocks in loader:
                beat()
                blocks = [block.to(self.device) for block in blocks]
                logits = model(blocks, self.g.ndata["feat"][input_nodes].to(self.device))
                labels = self.g.ndata["labels"][seeds].long().to(self.device)
                counts += torch.tensor([(logits.argmax(1) == labels).sum().item(), len(seeds)], dtype=torch.float64)
        torch.distributed.all_reduce(counts)
        return {"acc": counts[0].item() / max(counts[1].item(), 1)}

    def save_outputs(self, rank: int) -> None:
        """Full-graph layer-wise inference shared by all trainers; rank 0 writes it in original node order."""
        args, g = self.args, self.g
        if not (args.save_embeddings or args.save_predictions):
            return
        embeddings, logits = self.model.module.inference(g, args.eval_batch_size, self.device)
        if rank != 0:
            return
        orig_nids = np.load(Path(args.part_config).parent / "orig_nids.npy")
        out_dir = Path(args.out_dir)
        if args.save_embeddings:
            np.save(out_dir / "embeddings.npy", to_original_order(embeddings[0 : g.num_nodes()].numpy(), orig_nids))
        if args.save_predictions:
            predictions = logits[0 : g.num_nodes()].argmax(1).numpy()
            np.save(out_dir / "predictions.npy", to_original_order(predictions, orig_nids))

    def describe(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes, "in_feats": self.in_feats, "graph_name": self.graph_name}

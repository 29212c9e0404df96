"""Distributed RGCN node classification on a heterogeneous DistGraph (`dglkit train` on a partition with
several node types), as DGL's distributed rgcn example: one weight per relation plus a self loop, sampled
blocks, featured node types projected by a linear layer, featureless ones given learnt embeddings
(DistEmbedding, updated by DGL's distributed SparseAdam).

The labelled node type (the category) is the one with `labels`. Every epoch validates and tests; the test
accuracy of the best validation epoch is reported next to the final one. dglkit.loop trains it, checkpointing the
learnt embeddings and their optimizer state with the dense model. On request it writes predictions.npy
(category) and embeddings.npz (the category's last hidden layer, each featureless type's learnt embedding), rows
in original per-type IDs.
"""

import argparse
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
    if args.graphbolt:
        raise UserError("--graphbolt: the RGCN trainer samples heterogeneous graphs with DGL's own sampler; drop it")
    if (args.save_embeddings or args.save_predictions) and not (Path(args.part_config).parent / "orig_nids.npz").is_file():
        raise UserError(f"{Path(args.part_config).parent}/orig_nids.npz not found: outputs cannot be put back in "
                        "original per-type IDs; re-run `dglkit partition`")


class RelGraphConv(nn.Module):
    """One RGCN layer: sum over relations of the mean of neighbours times the relation's weight, plus a self
    loop and a bias, for every node type that has destination nodes in the block."""

    def __init__(self, in_feats: int, out_feats: int, relations: list[str], activation: bool, dropout: float):
        super().__init__()
        self.conv = dgl.nn.HeteroGraphConv(
            {rel: dgl.nn.GraphConv(in_feats, out_feats, norm="right", bias=False, allow_zero_in_degree=True)
             for rel in relations}, aggregate="sum")
        self.loop = nn.Linear(in_feats, out_feats)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)

    def forward(self, block, h: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        messages = self.conv(block, h)
        out = {}
        for ntype in block.dsttypes:
            if block.num_dst_nodes(ntype):
                x = self.loop(h[ntype][: block.num_dst_nodes(ntype)]) + messages.get(ntype, 0)
                out[ntype] = self.dropout(F.relu(x)) if self.activation else x
        return out


class RGCN(nn.Module):
    """Input projections of featured types, then `num_layers` relational layers; the dense part of the model."""

    def __init__(self, feat_dims: dict[str, int], num_hidden: int, num_classes: int, relations: list[str],
                 num_layers: int, dropout: float):
        super().__init__()
        self.project = nn.ModuleDict({ntype: nn.Linear(dim, num_hidden) for ntype, dim in feat_dims.items()})
        sizes = [num_hidden] * num_layers + [num_classes]
        self.layers = nn.ModuleList(RelGraphConv(a, b, relations, i < num_layers - 1, dropout)
                                    for i, (a, b) in enumerate(zip(sizes, sizes[1:])))

    def forward(self, blocks: list, inputs: dict[str, torch.Tensor], category: str) -> tuple:
        """(last hidden layer, logits) of the category's seed nodes."""
        h = {ntype: self.project[ntype](x) if ntype in self.project else x for ntype, x in inputs.items()}
        hidden = h
        for layer, block in zip(self.layers, blocks):
            hidden, h = h, layer(block, h)
        return hidden[category][: blocks[-1].num_dst_nodes(category)], h[category]


def init_embedding(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype).uniform_(-1.0, 1.0)


class Inputs:
    """Input rows of a block's source nodes: stored features, or learnt embeddings of featureless types."""

    def __init__(self, g, num_hidden: int):
        self.g = g
        self.embeddings = {
            ntype: dgl.distributed.DistEmbedding(g.num_nodes(ntype), num_hidden, f"dglkit_emb_{ntype}",
                                                 init_embedding, g.get_node_partition_policy(ntype))
            for ntype in g.ntypes if "feat" not in g.nodes[ntype].data}

    def __call__(self, input_nodes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {ntype: self.embeddings[ntype](ids) if ntype in self.embeddings else self.g.nodes[ntype].data["feat"][ids]
                for ntype, ids in input_nodes.items()}


class Task:
    metric = "acc"
    counts_correct = True
    # The learnt embeddings move on after the best epoch: its test figures are measured at that epoch.
    tests_every_epoch = True

    def __init__(self, args: argparse.Namespace, config: dict):
        self.args = args
        rank = torch.distributed.get_rank()
        g = self.g = dgl.distributed.DistGraph(config["graph_name"], part_config=args.part_config)
        self.graph_name = config["graph_name"]
        category = self.category = next(ntype for ntype in g.ntypes if "labels" in g.nodes[ntype].data)
        book = g.get_partition_book()
        self.nids = {name: dgl.distributed.node_split(g.nodes[category].data[f"{name}_mask"], book, ntype=category,
                                                      force_even=True) for name in ("train", "val", "test")}
        self.labels = g.nodes[category].data["labels"]
        self.num_classes = int(torch.max(self.labels[0 : g.num_nodes(category)])) + 1
        feat_dims = {t: g.nodes[t].data["feat"].shape[1] for t in g.ntypes if "feat" in g.nodes[t].data}
        log(rank, f"graph {config['graph_name']}: {dict((t, g.num_nodes(t)) for t in g.ntypes)} nodes, "
            f"{len(g.etypes)} relations, {self.num_classes} classes of {category}; featureless (learnt embeddings): "
            f"{[t for t in g.ntypes if t not in feat_dims]}; this trainer: "
            + ", ".join(f"{len(ids)} {name}" for name, ids in self.nids.items()))

        self.inputs = Inputs(g, args.num_hidden)
        self.embeddings = self.inputs.embeddings
        model = RGCN(feat_dims, args.num_hidden, self.num_classes, g.etypes, args.num_layers, args.dropout)
        # A block may lack some relations, whose weights then get no gradient in that step.
        self.model = DistributedDataParallel(model, find_unused_parameters=True)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        self.sparse_optimizer = (dgl.distributed.optim.SparseAdam(list(self.embeddings.values()), lr=args.sparse_lr)
                                 if self.embeddings else None)
        # SparseAdam's step exchanges gradients between all trainers, so all take the same number of steps: the
        # even split differs by at most one node per trainer, which the shorter shares decide.
        shortest = torch.tensor([len(self.nids["train"])])
        torch.distributed.all_reduce(shortest, op=torch.distributed.ReduceOp.MIN)
        self.sampler = dgl.dataloading.MultiLayerNeighborSampler(parse_fan_out(args.fan_out))
        self.loader = dgl.dataloading.DistNodeDataLoader(g, {category: self.nids["train"][: int(shortest)]},
                                                         self.sampler, batch_size=args.batch_size, shuffle=True,
                                                         drop_last=False)

    def step(self, batch: tuple) -> tuple[float, int, int]:
        input_nodes, seeds, blocks = batch
        _, logits = self.model(blocks, self.inputs(input_nodes), self.category)
        y = self.labels[seeds[self.category]].long()
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad()
        if self.sparse_optimizer:
            self.sparse_optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.sparse_optimizer:
            self.sparse_optimizer.step()
        return loss.item(), (logits.argmax(1) == y).sum().item(), len(y)

    def evaluate(self, split: str) -> dict[str, float]:
        """Accuracy on the category's nodes over all trainers (each passes its own share)."""
        model = self.model.module
        model.eval()
        counts = torch.zeros(2, dtype=torch.float64)
        loader = dgl.dataloading.DistNodeDataLoader(self.g, {self.category: self.nids[split]}, self.sampler,
                                                    batch_size=self.args.eval_batch_size, shuffle=False)
        with torch.no_grad():
            for input_nodes, seeds, blocks in loader:
                beat()
                _, logits = model(blocks, self.inputs(input_nodes), self.category)
                y = self.labels[seeds[self.category]].long()
                counts += torch.tensor([(logits.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
        torch.distributed.all_reduce(counts)
        return {"acc": counts[0].item() / max(counts[1].item(), 1)}

    def save_outputs(self, rank: int) -> None:
        if self.args.save_embeddings or self.args.save_predictions:
            save_outputs(self.args, self.model.module, self.inputs, self.g, self.category, rank)

    def describe(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes, "category": self.category,
                "featureless_types": sorted(self.embeddings), "graph_name": self.graph_name}


def save_outputs(args: argparse.Namespace, model, inputs: Inputs, g, category: str, rank: int) -> None:
    """Every trainer infers its share of the category over full neighbourhoods into shared DistTensors; rank 0
    writes them, and the learnt embeddings, in original per-type IDs."""
    n = g.num_nodes(category)
    hidden = dgl.distributed.DistTensor((n, args.num_hidden), torch.float32, "dglkit_rgcn_hidden", persistent=True)
    predicted = dgl.distributed.DistTensor((n,), torch.int64, "dglkit_rgcn_predicted", persistent=True)
    every_node = torch.ones(n, dtype=torch.bool)
    nodes = dgl.distributed.node_split(every_node, g.get_partition_book(), ntype=category, force_even=True)
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(args.num_layers)
    loader = dgl.dataloading.DistNodeDataLoader(g, {category: nodes}, sampler, batch_size=args.eval_batch_size)
    model.eval()
    with torch.no_grad():
        for input_nodes, seeds, blocks in loader:
            beat()
            h, logits = model(blocks, inputs(input_nodes), category)
            hidden[seeds[category]], predicted[seeds[category]] = h, logits.argmax(1)
    g.barrier()
    if rank != 0:
        return
    with np.load(Path(args.part_config).parent / "orig_nids.npz") as orig:
        orig_nids = {ntype: orig[ntype] for ntype in orig.files}
    out_dir = Path(args.out_dir)
    if args.save_predictions:
        np.save(out_dir / "predictions.npy", to_original_order(predicted[0:n].numpy(), orig_nids[category]))
    if args.save_embeddings:
        rows = {category: hidden[0:n].numpy(),
                **{t: emb.weight[0 : g.num_nodes(t)].numpy() for t, emb in inputs.embeddings.items()}}
        np.savez(out_dir / "embeddings.npz", **{t: to_original_order(v, orig_nids[t]) for t, v in rows.items()})

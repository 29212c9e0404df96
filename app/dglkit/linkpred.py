"""Distributed link prediction (`dglkit train --task link_prediction`): a GraphSAGE encoder and an MLP scoring
h_u * h_v (as DGL's link_pred example), trained on edges against uniformly sampled negatives.

Validation and test edges are the pairs `dglkit prepare --val-edges-frac/--test-edges-frac` removed from the
graph (edge_split.npz next to the dataset), so message passing never sees them. Each trainer ranks its share
of them against --eval-negs random destinations; MRR and hits@1/3/10 are summed over all trainers. dglkit.loop
trains it; on request it writes embeddings.npy in original node order.
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

from dglkit.common import UserError, beat, read_json
from dglkit.loop import log, to_original_order
from dglkit.sage import DistSAGE
from dglkit.settings import parse_fan_out

HITS = (1, 3, 10)


def edge_split_path(part_config: str) -> Path | None:
    """The held-out edges of the dataset this partition was made from (manifest.json names the dataset)."""
    manifest = read_json(Path(part_config).parent / "manifest.json")
    dataset_dir = Path(manifest["dataset_dir"]) if manifest and manifest.get("dataset_dir") else None
    dataset = read_json(dataset_dir / "dataset.json") if dataset_dir else None
    if not dataset or "held_out_edges" not in dataset:
        return None
    return dataset_dir / dataset["held_out_edges"]["file"]


def check(args: argparse.Namespace, config: dict) -> None:
    split = edge_split_path(args.part_config)
    if split is None or not split.is_file():
        raise UserError(f"the dataset of {args.part_config} holds out no edges: prepare it with "
                        "`dglkit prepare --val-edges-frac F --test-edges-frac F` (dgl_job_task=link_prediction does)")
    for name in ("orig_nids.npy", "orig_eids.npy"):
        if not (Path(args.part_config).parent / name).is_file():
            raise UserError(f"{Path(args.part_config).parent}/{name} not found: held-out and reverse edges cannot be "
                            "mapped to partitioned IDs; re-run `dglkit partition`")
    if args.num_negs < 1 or args.eval_negs < 1:
        raise UserError("--num-negs and --eval-negs must be >= 1")


def reverse_edge_ids(part_config: str) -> torch.Tensor:
    """Partitioned ID of each edge's reverse: prepare put the reverse of original edge i at i + E/2."""
    orig_eids = np.load(Path(part_config).parent / "orig_eids.npy")
    new_id = np.empty_like(orig_eids)
    new_id[orig_eids] = np.arange(len(orig_eids))
    return torch.from_numpy(new_id[(orig_eids + len(orig_eids) // 2) % len(orig_eids)])


def held_out_shares(part_config: str, rank: int, world: int) -> dict[str, torch.Tensor]:
    """This trainer's share of the validation and test pairs, in partitioned node IDs: {name: (2, n)}."""
    orig_nids = np.load(Path(part_config).parent / "orig_nids.npy")
    new_id = np.empty_like(orig_nids)
    new_id[orig_nids] = np.arange(len(orig_nids))
    path = edge_split_path(part_config)
    assert path is not None, "check() refuses a dataset without held-out edges"
    with np.load(path) as split:
        return {name: torch.from_numpy(np.stack([new_id[split[f"{name}_src"]], new_id[split[f"{name}_dst"]]]))[:, rank::world]
                for name in ("val", "test")}


class Task:
    metric = "mrr"
    counts_correct = False
    tests_every_epoch = False
    sparse_optimizer = None
    embeddings: dict[str, Any] = {}

    def __init__(self, args: argparse.Namespace, config: dict):
        self.args = args
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        g = self.g = dgl.distributed.DistGraph(config["graph_name"], part_config=args.part_config)
        self.graph_name = config["graph_name"]
        every_edge = torch.ones(g.num_edges(), dtype=torch.bool)
        train_eids = dgl.distributed.edge_split(every_edge, g.get_partition_book(), force_even=True)
        self.pairs = held_out_shares(args.part_config, rank, world)
        # Fixed negatives: each epoch's validation ranks the same candidates, so epochs compare.
        generator = torch.Generator().manual_seed((args.seed or 0) * 1000 + rank)
        self.negatives = {name: torch.randint(0, g.num_nodes(), (pair.shape[1], args.eval_negs), generator=generator)
                          for name, pair in self.pairs.items()}
        self.in_feats = g.ndata["feat"].shape[1]
        log(rank, f"graph {config['graph_name']}: {g.num_nodes()} nodes, {g.num_edges()} message-passing edges; "
            f"this trainer: {len(train_eids)} train edges, {self.pairs['val'].shape[1]} val, "
            f"{self.pairs['test'].shape[1]} test pairs")

        self.model = DistributedDataParallel(LinkPredictor(self.in_feats, args.num_hidden, args.num_layers,
                                                           args.dropout))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        self.sampler = dgl.dataloading.MultiLayerNeighborSampler(parse_fan_out(args.fan_out))
        # DGL 2.1's DistEdgeDataLoader takes the block sampler and the edge options itself (its EdgeCollator).
        # Asks for both directions of a batch's edges to leave its neighbourhoods, but DGL 2.1's
        # DistGraph.sample_neighbors ignores exclude_edges, so they stay (as in DGL's own unsupervised example).
        self.loader = dgl.dataloading.DistEdgeDataLoader(
            g, train_eids, self.sampler, exclude="reverse_id", reverse_eids=reverse_edge_ids(args.part_config),
            negative_sampler=PooledUniform(args.num_negs),
            batch_size=args.batch_size, shuffle=True, drop_last=False)

    def step(self, batch: tuple) -> tuple[float, int, int]:
        input_nodes, pos_graph, neg_graph, blocks = batch
        pos, neg = self.model(blocks, self.g.ndata["feat"][input_nodes], pos_graph, neg_graph)
        loss = F.binary_cross_entropy_with_logits(
            torch.cat([pos, neg]), torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item(), 0, len(pos)

    def evaluate(self, split: str) -> dict[str, float]:
        return rank_metrics(self.model.module, self.g, self.pairs[split], self.negatives[split], self.sampler,
                            self.args.eval_batch_size)

    def save_outputs(self, rank: int) -> None:
        if not self.args.save_embeddings:
            return
        g = self.g
        embeddings = self.model.module.encoder.inference(g, self.args.eval_batch_size, torch.device("cpu"))[1]
        if rank == 0:
            orig_nids = np.load(Path(self.args.part_config).parent / "orig_nids.npy")
            np.save(Path(self.args.out_dir) / "embeddings.npy",
                    to_original_order(embeddings[0 : g.num_nodes()].numpy(), orig_nids))

    def describe(self) -> dict[str, Any]:
        return {"in_feats": self.in_feats, "eval_negs": self.args.eval_negs, "graph_name": self.graph_name}


class PooledUniform(dgl.dataloading.negative_sampler.PerSourceUniform):
    """k negatives (u, v') for each edge (u, v), as DGL's Uniform(k), with the v' of a batch drawn from one pool
    of as many uniformly random nodes as the batch has edges. A batch's cost is the neighbourhoods it samples:
    with the pool it samples len(eids) negative nodes where Uniform(k) samples k * len(eids), so k negatives
    cost what DGL's one does."""

    def _generate(self, g, eids, canonical_etype):
        src, _ = g.find_edges(eids, etype=canonical_etype)
        pool = torch.randint(0, g.num_nodes(canonical_etype[2]), (len(eids),))
        return src.repeat_interleave(self.k), pool[torch.randint(0, len(pool), (len(eids) * self.k,))]


class LinkPredictor(nn.Module):
    """GraphSAGE node embeddings; an edge's score is an MLP of the product of its end nodes' embeddings."""

    def __init__(self, in_feats: int, num_hidden: int, num_layers: int, dropout: float):
        super().__init__()
        self.encoder = DistSAGE(in_feats, num_hidden, num_hidden, num_layers, dropout)
        self.predictor = nn.Sequential(nn.Linear(num_hidden, num_hidden), nn.ReLU(), nn.Linear(num_hidden, 1))

    def score(self, h_src: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        return self.predictor(h_src * h_dst).squeeze(-1)

    def forward(self, blocks: list, x: torch.Tensor, *pair_graphs) -> list[torch.Tensor]:
        """Scores of the edges of each pair graph, whose nodes are the last block's destination nodes."""
        h = self.encoder(blocks, x)
        return [self.score(h[pairs.edges()[0]], h[pairs.edges()[1]]) for pairs in pair_graphs]


def rank_metrics(model, g, pairs: torch.Tensor, negatives: torch.Tensor, sampler, batch_size: int) -> dict:
    """MRR and hits@k of each pair (u, v) ranked against (u, v') for its negatives v', over all trainers.
    A negative that scores as high as the positive ranks above it: ties never flatter the model."""
    model.eval()
    nodes, index = torch.unique(torch.cat([pairs.reshape(-1), negatives.reshape(-1)]), return_inverse=True)
    embeddings = torch.zeros(len(nodes), model.encoder.layers[-1]._out_feats)
    loader = dgl.dataloading.DistNodeDataLoader(g, nodes, sampler, batch_size=batch_size, shuffle=False)
    with torch.no_grad():
        for input_nodes, seeds, blocks in loader if len(nodes) else []:
            beat()
            embeddings[torch.searchsorted(nodes, seeds)] = model.encoder(blocks, g.ndata["feat"][input_nodes])
        n = pairs.shape[1]
        src, dst = embeddings[index[:n]], embeddings[index[n:2 * n]]
        neg = embeddings[index[2 * n:]].reshape(n, negatives.shape[1], -1)
        pos_score = model.score(src, dst).unsqueeze(1)
        neg_score = model.score(src.unsqueeze(1).expand_as(neg), neg)
    model.train()
    ranks = 1 + (neg_score >= pos_score).sum(1).double()
    sums = torch.tensor([(1 / ranks).sum().item(), *[(ranks <= k).sum().item() for k in HITS], n], dtype=torch.float64)
    torch.distributed.all_reduce(sums)
    count = max(sums[-1].item(), 1)
    return {"mrr": sums[0].item() / count, **{f"hits{k}": sums[i + 1].item() / count for i, k in enumerate(HITS)}}

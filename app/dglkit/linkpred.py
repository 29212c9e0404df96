"""Distributed link prediction (`dglkit train --task link_prediction`): a GraphSAGE encoder and an MLP scoring
h_u * h_v (as DGL's link_pred example), trained on edges against uniformly sampled negatives.

Validation and test edges are the pairs `dglkit prepare --val-edges-frac/--test-edges-frac` removed from the
graph (edge_split.npz next to the dataset), so message passing never sees them. Each trainer ranks its share
of them against --eval-negs random destinations; MRR and hits@1/3/10 are summed over all trainers. Rank 0
writes metrics.jsonl, model.pt, model-best.pt, result.json and, on request, embeddings.npy in original node order.
"""

import argparse
import copy
import time
from pathlib import Path

import dgl
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dglkit.common import UserError, read_json
from dglkit.train import (DistSAGE, is_heterogeneous, log, log_epoch, open_metrics, to_original_order, write_event,
                          write_result)

HITS = (1, 3, 10)


def edge_split_path(part_config: str) -> Path | None:
    """The held-out edges of the dataset this partition was made from (manifest.json names the dataset)."""
    manifest = read_json(Path(part_config).parent / "manifest.json")
    dataset_dir = Path(manifest["dataset_dir"]) if manifest and manifest.get("dataset_dir") else None
    dataset = read_json(dataset_dir / "dataset.json") if dataset_dir else None
    if not dataset or "held_out_edges" not in dataset:
        return None
    return dataset_dir / dataset["held_out_edges"]["file"]


def check_linkpred(args: argparse.Namespace, config: dict) -> None:
    if is_heterogeneous(config):
        raise UserError(f"{args.part_config} is a heterogeneous graph: link prediction here runs on homogeneous "
                        "graphs (synthetic, files, ogbn-products ...); use --task node_classification")
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
    with np.load(edge_split_path(part_config)) as split:
        return {name: torch.from_numpy(np.stack([new_id[split[f"{name}_src"]], new_id[split[f"{name}_dst"]]]))[:, rank::world]
                for name in ("val", "test")}


def train_linkpred(args: argparse.Namespace, config: dict) -> None:
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    device = torch.device("cpu")
    g = dgl.distributed.DistGraph(config["graph_name"], part_config=args.part_config)
    every_edge = torch.ones(g.num_edges(), dtype=torch.bool)
    train_eids = dgl.distributed.edge_split(every_edge, g.get_partition_book(), force_even=True)
    pairs = held_out_shares(args.part_config, rank, world)
    # Fixed negatives: each epoch's validation ranks the same candidates, so epochs compare.
    generator = torch.Generator().manual_seed((args.seed or 0) * 1000 + rank)
    negatives = {name: torch.randint(0, g.num_nodes(), (pair.shape[1], args.eval_negs), generator=generator)
                 for name, pair in pairs.items()}
    in_feats = g.ndata["feat"].shape[1]
    log(rank, f"graph {config['graph_name']}: {g.num_nodes()} nodes, {g.num_edges()} message-passing edges; this "
        f"trainer: {len(train_eids)} train edges, {pairs['val'].shape[1]} val, {pairs['test'].shape[1]} test pairs")

    model = DistributedDataParallel(LinkPredictor(in_feats, args.num_hidden, args.num_layers, args.dropout))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sampler = dgl.dataloading.MultiLayerNeighborSampler([int(f) for f in args.fan_out.split(",")])
    # DGL 2.1's DistEdgeDataLoader takes the block sampler and the edge options itself (its EdgeCollator).
    # Both directions of a batch's edges leave its neighbourhoods: the model cannot learn to look them up.
    loader = dgl.dataloading.DistEdgeDataLoader(
        g, train_eids, sampler, exclude="reverse_id", reverse_eids=reverse_edge_ids(args.part_config),
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(args.num_negs),
        batch_size=args.batch_size, shuffle=True, drop_last=False)

    metrics = open_metrics(args, world) if rank == 0 else None
    best = {"val_mrr": -1.0, "epoch": None, "state": None}
    for epoch in range(args.num_epochs):
        model.train()
        start = time.time()
        totals = torch.zeros(2, dtype=torch.float64)  # loss sum, positive edges
        with model.join():
            for step, (input_nodes, pos_graph, neg_graph, blocks) in enumerate(loader):
                pos, neg = model(blocks, g.ndata["feat"][input_nodes], pos_graph, neg_graph)
                loss = F.binary_cross_entropy_with_logits(
                    torch.cat([pos, neg]), torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                totals += torch.tensor([loss.item() * len(pos), len(pos)], dtype=torch.float64)
                if step % args.log_every == 0:
                    log(rank, f"epoch {epoch} step {step} loss {loss.item():.4f} edges {len(pos)}")
        epoch_time = torch.tensor([time.time() - start], dtype=torch.float64)
        torch.distributed.all_reduce(totals)
        torch.distributed.all_reduce(epoch_time, op=torch.distributed.ReduceOp.MAX)
        val = rank_metrics(model.module, g, pairs["val"], negatives["val"], sampler, args.eval_batch_size)
        if val["mrr"] > best["val_mrr"]:
            best = {"val_mrr": val["mrr"], "epoch": epoch, "state": copy.deepcopy(model.module.state_dict())}
        loss_sum, edges = totals.tolist()
        record = {"event": "epoch", "epoch": epoch, "loss": loss_sum / max(edges, 1),
                  **{f"val_{key}": value for key, value in val.items()}, "epoch_time": epoch_time.item(),
                  "seeds_per_s": edges / epoch_time.item(), "num_trainers": world}
        log_epoch(rank, record)
        if metrics:
            write_event(metrics, record)

    test = rank_metrics(model.module, g, pairs["test"], negatives["test"], sampler, args.eval_batch_size)
    final_state = model.module.state_dict()
    model.module.load_state_dict(best["state"])
    best_test = rank_metrics(model.module, g, pairs["test"], negatives["test"], sampler, args.eval_batch_size)
    log(rank, f"test_mrr {test['mrr']:.4f} (final model), {best_test['mrr']:.4f} (best validation model, epoch "
        f"{best['epoch']}, val_mrr {best['val_mrr']:.4f})")
    if args.save_embeddings:
        embeddings = model.module.encoder.inference(g, args.eval_batch_size, device)[1]
        if rank == 0:
            orig_nids = np.load(Path(args.part_config).parent / "orig_nids.npy")
            np.save(Path(args.out_dir) / "embeddings.npy",
                    to_original_order(embeddings[0 : g.num_nodes()].numpy(), orig_nids))
    if metrics:
        result = {**{f"test_{key}": value for key, value in test.items()},
                  **{f"best_test_{key}": value for key, value in best_test.items()},
                  "val_mrr": val["mrr"], "best_val_mrr": best["val_mrr"], "best_epoch": best["epoch"]}
        write_event(metrics, {"event": "test", **result})
        metrics.close()
        torch.save(final_state, Path(args.out_dir) / "model.pt")
        torch.save(best["state"], Path(args.out_dir) / "model-best.pt")
        write_result(args, {**result, "num_trainers": world, "in_feats": in_feats, "eval_negs": args.eval_negs,
                            "graph_name": config["graph_name"]})


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

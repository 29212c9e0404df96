"""Distributed GraphSAGE in the style of DGL's examples (started by DGL's launch.py or the kit, once per server
and once per trainer, through torchrun under launch.py) in which one process raises mid-training, as a bug would make it:
--fail server (server --fail_id, the machine's first one, which serves the barrier at the end of each epoch),
trainer (rank --fail_id) or sampler (a sampler process of trainer rank --fail_id), after --fail_after barrier
requests, steps or batches. --features names the node data it reads as input (as DGL's examples read `features`
from partitions whose node data is `feat`).
"""
import argparse
import multiprocessing
import os

import dgl
import torch as th
import torch.nn as nn
import torch.nn.functional as F


class Sampler(dgl.dataloading.NeighborSampler):
    """DGL's neighbour sampler; in a sampler process of trainer `fail_rank` it raises after `fail_after` batches."""

    def __init__(self, fanouts, fail_rank, fail_after):
        super().__init__(fanouts)
        self.fail_rank, self.fail_after, self.batches = fail_rank, fail_after, 0

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        self.batches += 1
        if (self.batches > self.fail_after and multiprocessing.parent_process() is not None
                and int(os.environ.get("RANK", -1)) == self.fail_rank):
            raise ValueError(f"injected sampler failure in trainer {self.fail_rank}'s sampler")
        return super().sample_blocks(g, seed_nodes, exclude_eids)


def fail_while_serving(server_id, fail_after):
    """Make this server's barrier handler raise after `fail_after` barrier requests."""
    barrier = dgl.distributed.kvstore.BarrierRequest.process_request
    served = [0]

    def process_request(self, server_state):
        served[0] += 1
        if served[0] > fail_after:
            raise KeyError(f"injected server failure in server {server_id}")
        return barrier(self, server_state)

    dgl.distributed.kvstore.BarrierRequest.process_request = process_request


class SAGE(nn.Module):
    def __init__(self, in_feats, n_hidden, n_classes):
        super().__init__()
        self.layers = nn.ModuleList([dgl.nn.SAGEConv(in_feats, n_hidden, "mean"),
                                     dgl.nn.SAGEConv(n_hidden, n_classes, "mean")])

    def forward(self, blocks, x):
        return self.layers[1](blocks[1], F.relu(self.layers[0](blocks[0], x)))


def main(args):
    if args.fail == "server" and os.environ.get("DGL_SERVER_ID") == str(args.fail_id):
        fail_while_serving(args.fail_id, args.fail_after)
    dgl.distributed.initialize(args.ip_config)
    th.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
    rank = th.distributed.get_rank()  # RANK (torchrun's, or the kit's), by which the kit names trainers
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], g.get_partition_book(), force_even=True)
    n_classes = int(g.ndata["labels"][0:g.num_nodes()].max()) + 1
    sampler = Sampler([10, 10], args.fail_id if args.fail == "sampler" else -1, args.fail_after)
    loader = dgl.dataloading.DistNodeDataLoader(g, train_nid, sampler, batch_size=args.batch_size, shuffle=True)
    model = th.nn.parallel.DistributedDataParallel(SAGE(g.ndata[args.features].shape[1], 16, n_classes))
    optimizer = th.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    for epoch in range(args.num_epochs):
        for input_nodes, seeds, blocks in loader:
            step += 1
            if args.fail == "trainer" and rank == args.fail_id and step > args.fail_after:
                raise RuntimeError(f"injected trainer failure in rank {rank} at step {step}")
            loss = F.cross_entropy(model(blocks, g.ndata[args.features][input_nodes]), g.ndata["labels"][seeds].long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"Part {rank} | Epoch {epoch:05d} | Loss {loss.item():.4f}", flush=True)
        g.barrier()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Distributed GraphSAGE with an injected failure")
    parser.add_argument("--graph_name", type=str)
    parser.add_argument("--ip_config", type=str)
    parser.add_argument("--part_config", type=str)
    parser.add_argument("--num_epochs", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--fail", choices=["none", "server", "trainer", "sampler"], default="none")
    parser.add_argument("--fail_id", type=int, default=1)
    parser.add_argument("--fail_after", type=int, default=5)
    parser.add_argument("--features", default="feat")
    parser.add_argument("--local_rank", type=int, help="set by torch.distributed.launch; unused")
    main(parser.parse_args())

"""Distributed RGCN entity classification written the way DGL's distributed rgcn example of the 2.1 era is:
started by DGL's tools/launch.py once per server and, through torchrun, once per trainer. It classifies the
`paper` nodes of a heterogeneous graph, projects the `features` of the node types that have them, learns a
DistEmbedding (sparse Adam on the servers) for the others (at least one type needs `features`),
and rank 0 saves `model.pt` and `result.json` to
paths relative to where it runs. It reads `features` and `labels`/the masks on `paper` only.
"""
import argparse
import json
import time

import dgl
import dgl.nn as dglnn
import torch as th
import torch.nn as nn
import torch.nn.functional as F

CATEGORY = "paper"


def init_emb(shape, dtype):
    return th.empty(shape, dtype=dtype).uniform_(-1.0, 1.0)


class DistEmbedLayer(nn.Module):
    """Input of every node type: a projection of its `features`, or a learnt embedding when it has none."""

    def __init__(self, g, embed_size: int):
        super().__init__()
        self.g = g
        self.node_projs = nn.ModuleDict({ntype: nn.Linear(g.nodes[ntype].data["features"].shape[1], embed_size)
                                         for ntype in g.ntypes if "features" in g.nodes[ntype].data})
        self.node_embeds = {ntype: dgl.distributed.DistEmbedding(g.num_nodes(ntype), embed_size, f"emb_{ntype}",
                                                                 init_emb, g.get_node_partition_policy(ntype))
                            for ntype in g.ntypes if ntype not in self.node_projs}

    def forward(self, node_ids: dict) -> dict:
        return {ntype: self.node_projs[ntype](self.g.nodes[ntype].data["features"][ids]) if ntype in self.node_projs
                else self.node_embeds[ntype](ids) for ntype, ids in node_ids.items()}


class EntityClassify(nn.Module):
    def __init__(self, rel_names: list[str], h_dim: int, out_dim: int, n_layers: int, dropout: float):
        super().__init__()
        self.layers = nn.ModuleList([dglnn.HeteroGraphConv(
            {rel: dglnn.GraphConv(h_dim, h_dim, norm="right", allow_zero_in_degree=True) for rel in rel_names})
            for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(h_dim, out_dim)

    def forward(self, blocks, h: dict) -> th.Tensor:
        for layer, block in zip(self.layers, blocks):
            h = {ntype: self.dropout(F.relu(x)) for ntype, x in layer(block, h).items()}
        return self.out(h[CATEGORY])


def accuracy(g, embed_layer, model, loader) -> float:
    """Correct predictions over all trainers."""
    model.eval()
    counts = th.zeros(2, dtype=th.float64)
    with th.no_grad():
        for input_nodes, seeds, blocks in loader:
            pred = model(blocks, embed_layer(input_nodes)).argmax(1)
            labels = g.nodes[CATEGORY].data["labels"][seeds[CATEGORY]].long()
            counts += th.tensor([(pred == labels).sum().item(), len(labels)], dtype=th.float64)
    th.distributed.all_reduce(counts)
    model.train()
    return counts[0].item() / max(counts[1].item(), 1)


def main(args):
    dgl.distributed.initialize(args.ip_config)
    th.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
    pb = g.get_partition_book()
    data = g.nodes[CATEGORY].data
    nids = {name: dgl.distributed.node_split(data[f"{name}_mask"], pb, ntype=CATEGORY, force_even=True)
            for name in ("train", "val", "test")}
    num_classes = int(data["labels"][0:g.num_nodes(CATEGORY)].max()) + 1
    sampler = dgl.dataloading.MultiLayerNeighborSampler([int(f) for f in args.fanout.split(",")])
    loaders = {name: dgl.dataloading.DistNodeDataLoader(g, {CATEGORY: ids}, sampler, batch_size=args.batch_size,
                                                         shuffle=name == "train")
               for name, ids in nids.items()}
    # The projections are dense parameters (all-reduced by DDP); the embeddings live on the servers.
    embed_layer = nn.parallel.DistributedDataParallel(DistEmbedLayer(g, args.n_hidden))
    model = EntityClassify(g.etypes, args.n_hidden, num_classes, len(args.fanout.split(",")), args.dropout)
    # The last layer's relations into other types than paper do not reach the loss.
    model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    optimizer = th.optim.Adam(list(model.parameters()) + list(embed_layer.parameters()), lr=args.lr)
    sparse = dgl.distributed.optim.SparseAdam(list(embed_layer.module.node_embeds.values()), lr=args.sparse_lr)

    for epoch in range(args.num_epochs):
        tic = time.time()
        for input_nodes, seeds, blocks in loaders["train"]:
            labels = data["labels"][seeds[CATEGORY]].long()
            loss = F.cross_entropy(model(blocks, embed_layer(input_nodes)), labels)
            optimizer.zero_grad()
            sparse.zero_grad()
            loss.backward()
            optimizer.step()
            sparse.step()
        val_acc = accuracy(g, embed_layer, model, loaders["val"])
        print(f"Part {g.rank()} | Epoch {epoch:05d} | Loss {loss.item():.4f} | Val Acc {val_acc:.4f} | "
              f"Time {time.time() - tic:.2f}s", flush=True)
    test_acc = accuracy(g, embed_layer, model, loaders["test"])
    print(f"Part {g.rank()} | Test Acc {test_acc:.4f}", flush=True)
    if g.rank() == 0:
        th.save(model.module.state_dict(), "model.pt")
        with open("result.json", "w") as f:
            json.dump({"val_acc": val_acc, "test_acc": test_acc, "num_classes": num_classes}, f)
    g.barrier()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Distributed RGCN (DGL example style)")
    parser.add_argument("--graph_name", type=str, help="graph name")
    parser.add_argument("--ip_config", type=str, help="the file for IP configuration")
    parser.add_argument("--part_config", type=str, help="the path to the partition config file")
    parser.add_argument("--num_epochs", type=int, default=3)
    parser.add_argument("--n_hidden", type=int, default=16)
    parser.add_argument("--fanout", type=str, default="4,4")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--sparse_lr", type=float, default=0.06)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--local_rank", type=int, help="set by torch.distributed.launch; unused")
    main(parser.parse_args())

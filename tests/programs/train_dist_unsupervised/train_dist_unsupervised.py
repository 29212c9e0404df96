"""Unsupervised distributed GraphSAGE written the way DGL's distributed examples of the 2.1 era are: started by
DGL's tools/launch.py once per server and, through torchrun, once per trainer; nothing beside this file (no
requirements.txt: scikit-learn and numpy come with the node environment).

Trains on link prediction (edges against uniform negatives, sampled with dgl.dataloading.DistEdgeDataLoader),
computes every node's embedding layer by layer, fits a logistic regression on the training nodes' embeddings
(scikit-learn) and prints its validation and test accuracy. Rank 0 saves the embeddings to `emb.pt`, a path
relative to where it runs, as DGL's example does. It reads the node data `features`, `labels` and the masks.
"""
import argparse
import time

import dgl
import dgl.function as fn
import numpy as np
import sklearn.linear_model as lm
import sklearn.metrics as skm
import torch as th
import torch.nn as nn
import torch.nn.functional as F


class DistSAGE(nn.Module):
    def __init__(self, in_feats: int, n_hidden: int, n_layers: int, dropout: float):
        super().__init__()
        self.n_hidden = n_hidden
        sizes = [in_feats] + [n_hidden] * n_layers
        self.layers = nn.ModuleList([dgl.nn.SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:])])
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h

    def inference(self, g, x, batch_size: int):
        """Every node's output, one layer at a time over all neighbours; each trainer computes its own nodes."""
        nodes = dgl.distributed.node_split(np.arange(g.num_nodes()), g.get_partition_book(), force_even=True)
        sampler = dgl.dataloading.NeighborSampler([-1])
        for i, layer in enumerate(self.layers):
            y = dgl.distributed.DistTensor((g.num_nodes(), self.n_hidden), th.float32, f"h{i}", persistent=True)
            loader = dgl.dataloading.DistNodeDataLoader(g, nodes, sampler, batch_size=batch_size, shuffle=False)
            for input_nodes, output_nodes, blocks in loader:
                h = x[input_nodes]
                h = layer(blocks[0], (h, h[:blocks[0].number_of_dst_nodes()]))
                y[output_nodes] = F.relu(h) if i < len(self.layers) - 1 else h
            x = y
            g.barrier()
        return y


def pair_loss(h, pos_graph, neg_graph):
    """Binary cross-entropy of dot-product scores: edges against negative pairs."""
    scores = []
    for pairs in (pos_graph, neg_graph):
        with pairs.local_scope():
            pairs.ndata["h"] = h
            pairs.apply_edges(fn.u_dot_v("h", "h", "score"))
            scores.append(pairs.edata["score"].view(-1))
    labels = th.cat([th.ones_like(scores[0]), th.zeros_like(scores[1])])
    return F.binary_cross_entropy_with_logits(th.cat(scores), labels)


def evaluate(emb, labels, train_nid, val_nid, test_nid):
    """Accuracy of a logistic regression fitted on the training nodes' (standardized) embeddings."""
    emb = emb.numpy()
    emb = (emb - emb.mean(0, keepdims=True)) / (emb.std(0, keepdims=True) + 1e-9)
    clf = lm.LogisticRegression(max_iter=1000).fit(emb[train_nid], labels[train_nid])
    pred = clf.predict(emb)
    return skm.accuracy_score(labels[val_nid], pred[val_nid]), skm.accuracy_score(labels[test_nid], pred[test_nid])


def main(args):
    print("--- Distributed unsupervised GraphSAGE ---", flush=True)
    dgl.distributed.initialize(args.ip_config)
    th.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
    print(f"rank {g.rank()}: {g.num_nodes()} nodes, {g.num_edges()} edges", flush=True)
    train_eids = dgl.distributed.edge_split(th.ones((g.num_edges(),), dtype=th.bool), g.get_partition_book(),
                                            force_even=True)
    sampler = dgl.dataloading.NeighborSampler([int(f) for f in args.fan_out.split(",")])
    loader = dgl.dataloading.DistEdgeDataLoader(
        g, train_eids, sampler, negative_sampler=dgl.dataloading.negative_sampler.Uniform(args.num_negs),
        batch_size=args.batch_size, shuffle=True)
    model = DistSAGE(g.ndata["features"].shape[1], args.num_hidden, args.num_layers, args.dropout)
    model = th.nn.parallel.DistributedDataParallel(model)
    optimizer = th.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.num_epochs):
        tic, losses = time.time(), []
        with model.join():
            for step, (input_nodes, pos_graph, neg_graph, blocks) in enumerate(loader):
                loss = pair_loss(model(blocks, g.ndata["features"][input_nodes]), pos_graph, neg_graph)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if step % args.log_every == 0:
                    print(f"[{g.rank()}] Epoch {epoch:05d} | Step {step:05d} | Loss {loss.item():.4f}", flush=True)
        print(f"[{g.rank()}] Epoch {epoch:05d} | Loss {np.mean(losses):.4f} | Time {time.time() - tic:.2f}s",
              flush=True)

    model.eval()
    with th.no_grad():
        emb = model.module.inference(g, g.ndata["features"], args.batch_size_eval)
    if g.rank() == 0:
        everything = np.arange(g.num_nodes())
        emb = emb[everything]
        labels = g.ndata["labels"][everything].numpy()
        masks = [np.nonzero(g.ndata[name][everything].numpy())[0] for name in ("train_mask", "val_mask", "test_mask")]
        val_acc, test_acc = evaluate(emb, labels, *masks)
        print(f"eval acc {val_acc:.4f}; test acc {test_acc:.4f}", flush=True)
        th.save(emb, "emb.pt")
    th.distributed.barrier()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Distributed unsupervised GraphSAGE (DGL example style)")
    parser.add_argument("--graph_name", type=str, help="graph name")
    parser.add_argument("--ip_config", type=str, help="the file for IP configuration")
    parser.add_argument("--part_config", type=str, help="the path to the partition config file")
    parser.add_argument("--num_epochs", type=int, default=3)
    parser.add_argument("--num_hidden", type=int, default=32)
    parser.add_argument("--num_layers", type=int, default=2)
    parser.add_argument("--fan_out", type=str, default="10,25")
    parser.add_argument("--batch_size", type=int, default=1000)
    parser.add_argument("--batch_size_eval", type=int, default=10000)
    parser.add_argument("--num_negs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--log_every", type=int, default=20)
    parser.add_argument("--local_rank", type=int, help="set by torch.distributed.launch; unused")
    main(parser.parse_args())

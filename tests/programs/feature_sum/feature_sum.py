"""A program with no requirements.txt, started as DGL's tools/launch.py starts one (servers, then trainers
through torchrun): every trainer sums the features of its share of the nodes, the sums are all-reduced and
rank 0 writes the total to {output_dir}/result.json. It needs nothing beyond the node environment.
"""
import argparse
import json
import os

import dgl
import torch as th


def main(args):
    dgl.distributed.initialize(args.ip_config)
    th.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
    nids = dgl.distributed.node_split(th.ones(g.num_nodes(), dtype=th.bool), g.get_partition_book(), force_even=True)
    totals = th.tensor([g.ndata["feat"][nids].double().sum().item(), len(nids)], dtype=th.float64)
    th.distributed.all_reduce(totals)
    print(f"rank {g.rank()}: {len(nids)} nodes of {int(totals[1])}", flush=True)
    if g.rank() == 0 and args.output_dir:
        with open(os.path.join(args.output_dir, "result.json"), "w") as f:
            json.dump({"feature_sum": totals[0].item(), "num_nodes": int(totals[1])}, f)
        if args.extra_mb:
            with open(os.path.join(args.output_dir, "extra.bin"), "wb") as f:
                f.write(os.urandom(args.extra_mb << 20))
    th.distributed.barrier()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Sum of the node features over the cluster (DGL example style)")
    parser.add_argument("--graph_name", type=str)
    parser.add_argument("--ip_config", type=str)
    parser.add_argument("--part_config", type=str)
    parser.add_argument("--output_dir", type=str, default="")
    parser.add_argument("--extra_mb", type=int, default=0, help="rank 0 also writes this many MB of random bytes")
    main(parser.parse_args())

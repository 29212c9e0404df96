"""Imported first by every Python process of a job: the launcher puts this directory at the front of
PYTHONPATH. An uncaught exception ends the process at once, with its traceback. Without this, DGL's exit
handler waits for the other trainers, which wait in an all-reduce for this one: the process never exits,
torchrun never reports it, and the job hangs instead of failing.

A DGL server of a job with `node_data_names` ($DGLKIT_NODE_DATA_NAMES: {stored key: served key}) serves its
partition's node data under the names the program reads: the keys are renamed as DGL loads the part's
node_feat.dgl, so no data is copied (dglkit.nodedata).

(It takes the place of Debian's sitecustomize, which only installs apport's crash hook.)
"""
import json
import os
import sys
import traceback


def exit_on_uncaught_exception(kind, value, tb) -> None:
    traceback.print_exception(kind, value, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def serve_node_data_as(served: dict[str, str]) -> None:
    from dgl.distributed import dist_graph

    load = dist_graph.load_partition_feats

    def load_renamed(*args, **kwargs):
        node_feats, edge_feats = load(*args, **kwargs)
        if node_feats is not None:
            node_feats = {served.get(key, key): value for key, value in node_feats.items()}
        return node_feats, edge_feats

    dist_graph.load_partition_feats = load_renamed


sys.excepthook = exit_on_uncaught_exception
if os.environ.get("DGL_ROLE") == "server" and os.environ.get("DGLKIT_NODE_DATA_NAMES"):
    try:
        serve_node_data_as(json.loads(os.environ["DGLKIT_NODE_DATA_NAMES"]))
    except Exception:
        # Python would carry on after a failed sitecustomize, and the program would then miss its data by name.
        exit_on_uncaught_exception(*sys.exc_info())

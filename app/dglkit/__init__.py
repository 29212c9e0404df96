"""dgl-cluster-kit's node application: one module per job (data, partition, train, launch)."""

__version__ = "0.1.0"

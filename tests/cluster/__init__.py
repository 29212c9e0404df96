"""The nspawn test clusters: staging (cached roots, wheelhouse, apt repository, venv seeds), testcluster.py (the
CLI that boots them) and clusterclient.py (their one client, for the tests and the bench scripts)."""

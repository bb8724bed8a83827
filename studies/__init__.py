"""The studies: scripts that write docs/'s tables and plots (python studies/X.py),
installed as easgd.studies so that they share one harness (harness.py) and the
faults study its injections (fault_injections.py)."""

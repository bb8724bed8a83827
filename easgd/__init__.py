"""Elastic-averaging SGD and its relatives as pure update rules over sharded arrays."""

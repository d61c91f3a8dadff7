"""Topology discovery: the model and the readers that fill it (sysfs, lscpu, snapshots)."""

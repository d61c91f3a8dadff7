"""The cpuset enforcement engines: the CRI loop, the NRI hooks and their upkeep, auto, evictions."""

"""The cpuset enforcement engines and what they share (:mod:`agent.enforce.engine`): the CRI loop, the NRI protocol's
hooks and their upkeep, auto, the choice between them at start, and the evictions of stranded holders' pods."""

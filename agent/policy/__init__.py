"""Pure policy over the topology model: grouping, allocation planning, preferences."""

"""The running agent: its settings, the composition root, the agent object and its loops."""

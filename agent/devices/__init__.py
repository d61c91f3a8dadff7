"""The node's device table and its saved state: what kubelet is offered and who holds it."""

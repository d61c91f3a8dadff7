"""A real single-node Kubernetes lane on this machine: the images it runs (:mod:`.images`) and the cluster itself."""

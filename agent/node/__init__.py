"""The node side of the agent: node labels and annotations, and who else owns CPUs on the node.

* :mod:`agent.node.labels` -- pure: topology + grouping -> labels and one JSON annotation;
* :mod:`agent.node.reporter` -- keeps the labels and the CPU manager findings current;
* :mod:`agent.node.labeler` -- a thin adapter that patches the Node object, only when something changed,
  over :mod:`agent.node.kubeapi` (the standard library's HTTPS client, the pod's service account);
* :mod:`agent.node.cpu_manager` -- kubelet's CPU manager checkpoint and ``reservedSystemCPUs``, and
  warnings when they clash with the advertised groups;
* :mod:`agent.node.seccomp` -- the seccomp profile vLLM needs, written where kubelet reads profiles.
* :mod:`agent.node.resource_withdrawal`, :mod:`agent.node.cleanup` -- a hand-over to the other mode, the uninstall.

Nothing is imported here: ``seccomp-profile`` (the chart's init container) loads only what it uses.
"""

"""Development kit of s390x-topology-agent: what tests, benchmarks and the demo need, and nodes do not.

* :mod:`topology_devkit.kubelet_emulator` -- kubelet's device manager, registration and pod-resources,
  on real Unix sockets;
* :mod:`topology_devkit.synthetic` -- z14-z17 LPAR shapes (and ``--write-data`` for ``agent/data``);
* :mod:`topology_devkit.sysfs_writer` -- a kernel-faithful ``/sys`` tree for a topology;
* :mod:`topology_devkit.shape` -- an id-free shape of a topology, to compare sources;
* :mod:`topology_devkit.demo` -- ``topology-agent demo`` (found through the ``topology_agent.demo`` entry point).
* :mod:`topology_devkit.containerd` -- a private real containerd with runc and crun, pods with kubelet's labels.
"""

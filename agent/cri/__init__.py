"""The container runtime adapter: a client of the CRI ``runtime.v1`` RuntimeService (containerd, CRI-O).

Only what CPU set enforcement needs: find kubelet's containers by their labels, read a container's
state and cpuset, and update its cpuset (see ../shared/docs/real-containerd.md). Never on the
Allocate path.
"""

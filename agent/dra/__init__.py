"""DRA mode: the second adapter beside agent/plugin (ResourceSlices, the kubelet DRA plugin, CDI)."""

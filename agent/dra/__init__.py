"""DRA mode: the second adapter beside agent/plugin (the driver, ResourceSlices, the kubelet DRA plugin, CDI)."""

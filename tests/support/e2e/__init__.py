"""What the end-to-end suite (tests/e2e/) shares: the cluster and its lane (cluster), kubectl and the API client
(kube), DRA mode (dra), a real node's agent, pods and metrics (node), vLLM servers (vllm)."""

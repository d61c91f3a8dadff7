"""kind end-to-end tests (make kind-test): skipped unless a kind cluster with the chart is reachable."""

"""The soak: pod churn and seeded faults on the real-cluster lane, every CPU accounted for every second.

``invariants`` is the pure checker, ``truth`` reads the host and the API server into its snapshots, ``plan`` is the
seeded schedule and ``run`` (``make soak``) drives them. bench/README.md, section "Soak", has the figures.
"""

"""What tests, benches and the devkit's own tools share to drive the agent from outside: one wait with a deadline
(wait.py) and one fake Kubernetes API server over HTTP(S) (apiserver.py). Standard library only: no grpc, so the
s390x smoke's grpc-free tests may use them."""

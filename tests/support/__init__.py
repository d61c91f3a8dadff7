"""What the tests share and no test file is imported for: the test environment (env), the running agent against
the kubelet emulator (harness), the chart's rendering (chart), stand-ins for the API server and the runtime
(kubeapi, enforcement, runtime), the docs as data (docs), a lane's script as a module (scripts), and the cluster
suite's helpers (e2e/). Fixtures are in the conftest.py of the folder that uses them. Waits and the fake HTTP API
server are the devkit's (topology_devkit.testing), shared with bench/.

env.py imports nothing but pytest: the root conftest.py imports it, and the s390x smoke (tools/s390x-smoke.sh)
runs every unit test module that imports no grpc, followed through these modules."""

"""What the tests share and no test file is imported for: the test environment (env), the running agent against
the kubelet emulator (harness), the chart's rendering (chart), stand-ins for the API server and the runtime.
Fixtures are in the conftest.py of the folder that uses them. Waits and the fake HTTP API server are the devkit's
(topology_devkit.testing), shared with bench/.

Keep this package free of grpc at import time: the s390x smoke (tools/s390x-smoke.sh) runs every test module that
imports no grpc, followed through these modules. Only harness.py and the modules that say so import it."""

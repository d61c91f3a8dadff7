"""``mode: dra`` on an API server older than what DRA mode writes (Kubernetes 1.34: the CRI-O lane, ``make e2e
RUNTIME=crio``): the agent reads what the API server serves and refuses at start with one line naming the minor it
needs (agent/dra/served.py), exit 2, instead of publishing slices the scheduler would read another way. The release
is switched back to device-plugin mode, which serves the node's books again.

Where the API server serves what DRA mode needs (1.35 and newer), tests/e2e/test_dra.py judges DRA mode itself and
this test skips. The local lane only (it changes the release).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import wait_for

pytestmark = pytest.mark.e2e

REFUSAL = "--mode dra needs Kubernetes 1.36 or newer (1.35 with the DRAPartitionableDevices feature gate on)"


def server_minor(env: E2EEnv) -> tuple[int, str]:
    version = json.loads(env.kubectl("get", "--raw", "/version").stdout)
    return int(re.match(r"\d+", str(version["minor"])).group()), str(version["gitVersion"])  # type: ignore[union-attr]


@pytest.fixture()
def old_server(local: E2EEnv) -> Iterator[E2EEnv]:
    minor, git = server_minor(local)
    if minor >= 35:
        pytest.skip(f"the API server is {git}: DRA mode runs there (tests/e2e/test_dra.py judges it)")
    try:
        yield local
    finally:
        local.helm_upgrade()


def refused_agent(env: E2EEnv) -> dict[str, Any] | None:
    """The release's agent pod once its container ended with exit status 2 (at least once)."""
    pods = json.loads(env.kubectl("-n", env.namespace, "get", "pods", "-l",
                                  f"app.kubernetes.io/instance={env.release}", "-o", "json").stdout)["items"]
    for pod in pods:
        for status in pod["status"].get("containerStatuses") or []:
            for state in (status.get("state") or {}, status.get("lastState") or {}):
                if (state.get("terminated") or {}).get("exitCode") == 2:
                    return pod
    return None


def test_mode_dra_is_refused_in_one_line_naming_the_minor_it_needs(old_server: E2EEnv, node: str) -> None:
    env = old_server
    _, git = server_minor(env)
    env.helm_upgrade("--set", "mode=dra", "--set-json", 'agent.levels=["book","socket"]', wait=False)
    pod = wait_for("the DRA agent to exit with status 2", lambda: refused_agent(env), timeout=180, interval=1)
    name = pod["metadata"]["name"]
    logs = wait_for(f"{name}'s refusal in its log", lambda: next(
        (out for previous in ("--previous", None) if REFUSAL in (out := _logs(env, name, previous))), None),
        timeout=60, interval=1)
    lines = [line for line in logs.splitlines() if REFUSAL in line]
    print(f"the agent on {git}: {lines}")
    assert len(lines) == 1 and git in lines[0], logs[-2000:]
    assert "Traceback" not in logs, logs[-2000:]
    slices = json.loads(env.kubectl("get", "resourceslices", "--field-selector", f"spec.nodeName={node}", "-o",
                                    "json").stdout)["items"]
    assert not slices, f"a refused agent published {[s['metadata']['name'] for s in slices]}"


def _logs(env: E2EEnv, pod: str, previous: str | None) -> str:
    try:
        return env.kubectl("-n", env.namespace, "logs", pod, *([previous] if previous else [])).stdout
    except Exception:  # no previous container yet
        return ""

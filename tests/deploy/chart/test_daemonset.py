"""The chart's DaemonSet: the host paths it mounts and how, its security context, probes, scheduling and update
strategy, the settings that reach the agent's environment, and the fake-topology mode of the kind lane."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable

import pytest

from agent import __version__
from agent.version import semver
from tests.support.chart import (
    CHART,
    FAKE_ARGS,
    Render,
    agent_container,
    env_of,
    mounts_of,
    one,
)
from tests.support.env import REPO

# ------------------------------------------------------------------------------------------------- DaemonSet


def test_kubelet_directories_are_mounted_as_directories(render: Render) -> None:
    mounts = mounts_of(render())
    dp_mount, dp_volume = mounts["device-plugins"]
    assert dp_mount["mountPath"] == "/var/lib/kubelet/device-plugins"
    assert dp_volume["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert not dp_mount.get("readOnly")  # the agent creates its sockets there
    pr_mount, pr_volume = mounts["pod-resources"]
    assert pr_mount["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert pr_volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    for _, volume in mounts.values():
        host = volume.get("hostPath")
        if host:
            assert not host["path"].endswith(".sock") and host.get("type") != "Socket"


def test_sys_is_mounted_read_only_and_proc_is_the_containers_own(render: Render) -> None:
    docs = render()
    mount, volume = mounts_of(docs)["host-sys"]
    assert mount == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}
    assert volume["hostPath"]["path"] == "/sys"
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_HOST_ROOT"] == "/host"
    assert env["TOPOLOGY_AGENT_PROC_ROOT"] == "/proc"  # /proc/sysinfo and /proc/cpuinfo are not namespaced
    assert "TOPOLOGY_AGENT_TOPOLOGY_FILE" not in env


def test_kubelet_root_moves_what_kubelet_moves_and_not_the_device_plugin_directory(render: Render) -> None:
    """kubelet 1.37: pod-resources, plugins_registry, plugins/ and its state follow --root-dir; the device manager
    listens on the constant /var/lib/kubelet/device-plugins/kubelet.sock (docs/admin/kubelet-roots.md)."""
    root = "/var/snap/microk8s/common/var/lib/kubelet"
    docs = render("--set", f"kubelet.root={root}/", "--set", "mode=dra", "--set", "seccompProfile.install=true")
    mounts = mounts_of(docs)
    assert mounts["device-plugins"][1]["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert mounts["pod-resources"][1]["hostPath"] == {"path": f"{root}/pod-resources", "type": "Directory"}
    assert mounts["kubelet-root"][1]["hostPath"] == {"path": root, "type": "Directory"}
    assert mounts["dra-registry"][1]["hostPath"]["path"] == f"{root}/plugins_registry"
    assert mounts["dra-plugin"][1]["hostPath"]["path"] == f"{root}/plugins/topology.s390x.ibm.com"
    assert mounts["seccomp-profiles"][1]["hostPath"]["path"] == f"{root}/seccomp/profiles"
    # The container paths do not move, and the agent is told where they are.
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_KUBELET_DIR"] == mounts["device-plugins"][0]["mountPath"]
    assert env["TOPOLOGY_AGENT_POD_RESOURCES_SOCKET"] == mounts["pod-resources"][0]["mountPath"] + "/kubelet.sock"
    assert env["TOPOLOGY_AGENT_DRA_REGISTRY_DIR"] == f"{root}/plugins_registry"  # kubelet dials what the agent names


def test_a_kubelet_built_with_another_device_plugin_directory(render: Render) -> None:
    mounts = mounts_of(render("--set", "kubelet.devicePluginDir=/data/kubelet/device-plugins/"))
    assert mounts["device-plugins"][1]["hostPath"] == {"path": "/data/kubelet/device-plugins", "type": "Directory"}
    assert mounts["device-plugins"][0]["mountPath"] == "/var/lib/kubelet/device-plugins"


def test_kubelet_state_mount_is_opt_in_and_read_only(render: Render) -> None:
    docs = render("--set", "cpusetEnforcement=none")  # enforcement (the default auto) reads the state too
    assert "kubelet-root" not in mounts_of(docs)
    env = env_of(agent_container(docs))
    assert "TOPOLOGY_AGENT_CPU_MANAGER_STATE" not in env and "TOPOLOGY_AGENT_KUBELET_CONFIG" not in env
    docs = render("--set", "kubelet.readState=true")
    mount, volume = mounts_of(docs)["kubelet-root"]
    assert mount["readOnly"] is True and volume["hostPath"] == {"path": "/var/lib/kubelet", "type": "Directory"}
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_CPU_MANAGER_STATE"] == mount["mountPath"] + "/cpu_manager_state"
    assert env["TOPOLOGY_AGENT_KUBELET_CONFIG"] == mount["mountPath"] + "/config.yaml"


def test_security_context_uid0_without_privileges(render: Render) -> None:
    docs = render()
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    sc = agent_container(docs)["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    # A read-only root filesystem still needs a writable /tmp.
    assert mounts_of(docs)["tmp"][1]["emptyDir"]["medium"] == "Memory"


def test_security_context_says_why_uid0(helm: str) -> None:
    text = (CHART / "templates" / "daemonset.yaml").read_text()
    comment = " ".join(line.strip().lstrip("#").strip() for line in text.splitlines() if line.strip().startswith("#"))
    for words in ("uid 0", "0750", "CAP_DAC_OVERRIDE", "capability is dropped", "65532"):
        assert words in comment, f"the security-context comment should mention {words!r}"


def test_probes_on_healthz_and_readyz(render: Render) -> None:
    container = agent_container(render("--set", "metrics.port=9555"))
    assert container["ports"] == [{"name": "metrics", "containerPort": 9555, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert env_of(container)["TOPOLOGY_AGENT_METRICS_PORT"] == "9555"


def test_scrape_annotations(render: Render) -> None:
    annotations = one(render(), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9400",
                           "prometheus.io/path": "/metrics"}
    docs = render("--set", "metrics.podAnnotations=false")
    assert not one(docs, "DaemonSet")["spec"]["template"]["metadata"].get("annotations")


def test_priority_tolerations_and_arch_selector(render: Render) -> None:
    pod = one(render("--set-json", 'extraTolerations=[{"key":"ibm.com/z","operator":"Exists"}]'),
              "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "s390x"}
    tolerations = pod["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in tolerations
    assert {"operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"operator": "Exists", "effect": "NoExecute"} in tolerations
    assert tolerations[-1] == {"key": "ibm.com/z", "operator": "Exists"}


def test_node_selector_is_overridable(render: Render) -> None:
    # Helm merges maps: a default key goes away by setting it to null.
    pod = one(render("--set-json", 'nodeSelector={"kubernetes.io/arch":null,"example.com/pool":"inference"}'),
              "DaemonSet")
    assert pod["spec"]["template"]["spec"]["nodeSelector"] == {"example.com/pool": "inference"}
    pod = one(render("--set", "nodeSelector=null"), "DaemonSet")
    assert "nodeSelector" not in pod["spec"]["template"]["spec"]


def test_rolling_update_never_surges(render: Render) -> None:
    strategy = one(render(), "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_agent_settings_reach_the_environment(render: Render) -> None:
    env = env_of(agent_container(render(
        "--set", "agent.levels=book\\,socket",
        "--set", "agent.resourcePrefix=z.example.com",
        "--set", "agent.reservedCpus=0-1\\,8",
        "--set-json", 'agent.excludePolarization=["vertical:low","unknown"]',
        "--set", "agent.ompThreadsPerCore=2",
        "--set", "agent.reserveCoresPerGroup=0",
        "--set", "agent.minGroupCores=3",
        "--set", "agent.openmpEnv=true",
        "--set", "agent.logLevel=debug",
        "--set", "agent.logFormat=text",
        "--set", "agent.nodeLabels=false",
        "--set-json", "agent.rescanInterval=2.5",
        "--set", "agent.podResourcesInterval=0",
    )))
    assert env["TOPOLOGY_AGENT_LEVELS"] == "book,socket"
    assert env["TOPOLOGY_AGENT_RESOURCE_PREFIX"] == "z.example.com"
    assert env["TOPOLOGY_AGENT_RESERVED_CPUS"] == "0-1,8"
    assert env["TOPOLOGY_AGENT_EXCLUDE_POLARIZATION"] == "vertical:low,unknown"
    assert env["TOPOLOGY_AGENT_OMP_THREADS_PER_CORE"] == "2"
    assert env["TOPOLOGY_AGENT_RESERVE_CORES_PER_GROUP"] == "0"
    assert env["TOPOLOGY_AGENT_MIN_GROUP_CORES"] == "3"
    assert env["TOPOLOGY_AGENT_OPENMP_ENV"] == "true"
    assert env["TOPOLOGY_AGENT_LOG_LEVEL"] == "debug"
    assert env["TOPOLOGY_AGENT_LOG_FORMAT"] == "text"
    assert env["TOPOLOGY_AGENT_NODE_LABELS"] == "false"
    assert env["TOPOLOGY_AGENT_RESCAN_INTERVAL"] == "2.5"
    assert env["TOPOLOGY_AGENT_POD_RESOURCES_INTERVAL"] == "0"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_container_level_openmp_env_is_off_and_one_core_is_reserved_by_default(render: Render) -> None:
    env = env_of(agent_container(render()))
    assert env["TOPOLOGY_AGENT_OPENMP_ENV"] == "false"
    assert env["TOPOLOGY_AGENT_RESERVE_CORES_PER_GROUP"] == "1"
    assert env["TOPOLOGY_AGENT_MIN_GROUP_CORES"] == "auto"


def test_the_runtime_socket_is_mounted_only_with_cpuset_enforcement(render: Render) -> None:
    plain = mounts_of(render("--set", "cpusetEnforcement=none"))
    assert "cri-socket" not in plain and "nri-socket" not in plain and "kubelet-root" not in plain
    default = render()  # auto: NRI where the runtime offers it, else CRI; both sockets' folders and the state
    assert env_of(agent_container(default))["TOPOLOGY_AGENT_CPUSET_ENFORCEMENT"] == "auto"
    assert {"cri-socket", "nri-socket", "kubelet-root"} <= set(mounts_of(default))
    docs = render("--set", "cpusetEnforcement=cri", "--set", "sharedPool=true",
                  "--set", "criSocket=/run/crio/crio.sock")
    mounts = mounts_of(docs)
    mount, volume = mounts["cri-socket"]
    assert volume["hostPath"] == {"path": "/run/crio", "type": "Directory"}
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_CRI_SOCKET"] == f"{mount['mountPath']}/crio.sock"
    assert env["TOPOLOGY_AGENT_CPUSET_ENFORCEMENT"] == "cri" and env["TOPOLOGY_AGENT_SHARED_POOL"] == "true"
    # kubelet's state is read, to refuse enforcement under the static CPU manager policy
    assert mounts["kubelet-root"][0]["readOnly"] is True and "TOPOLOGY_AGENT_CPU_MANAGER_STATE" in env


def test_seccomp_profile_install_is_an_init_container_writing_under_kubelets_seccomp_dir(render: Render) -> None:
    plain = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert "initContainers" not in plain
    assert "seccomp-profiles" not in {v["name"] for v in plain["volumes"]}
    spec = one(render("--set", "seccompProfile.install=true", "--set", "kubelet.root=/var/lib/k0s/kubelet"),
               "DaemonSet")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["args"] == ["seccomp-profile", "--install", "/host-seccomp/profiles"]
    assert init["image"] == agent_container(render())["image"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert init["resources"]["limits"] == {"cpu": "100m", "memory": "64Mi"}  # bounded, unlike the agent's CPU
    (mount,) = init["volumeMounts"]
    volume = {v["name"]: v for v in spec["volumes"]}[mount["name"]]
    assert volume["hostPath"] == {"path": "/var/lib/k0s/kubelet/seccomp/profiles", "type": "DirectoryOrCreate"}
    # The agent mounts it only to remove the profile when the release is uninstalled (uninstall.cleanup).
    assert mount["name"] in {m["name"] for m in spec["containers"][0]["volumeMounts"]}
    spec = one(render("--set", "seccompProfile.install=true", "--set", "uninstall.cleanup=false"),
               "DaemonSet")["spec"]["template"]["spec"]
    assert mount["name"] not in {m["name"] for m in spec["containers"][0]["volumeMounts"]}


def test_every_agent_variable_is_a_serve_flag(render: Render, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's TOPOLOGY_AGENT_* variables name real flags of `topology-agent serve`, with values it accepts."""
    from agent import cli
    from agent.cli.flags import ENV_PREFIX
    from agent.cli.settings import allocation_settings, grouping_settings

    container = agent_container(render("--set", "kubelet.readState=true", "--set-json",
                                       'agent.excludePolarization=["vertical:low"]', "--set", "agent.levels=book",
                                       "--set", "metrics.allocationsPodNames=true"))
    assert container["args"] == ["serve"]
    env = {k: v for k, v in env_of(container).items() if k.startswith(ENV_PREFIX)}
    serve = next(a for a in cli.build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    flags = {opt for action in serve._actions for opt in action.option_strings}
    to_flag = {k: "--" + k[len(ENV_PREFIX):].lower().replace("_", "-") for k in env}
    unknown = sorted(k for k, flag in to_flag.items() if flag not in flags)
    assert not unknown, f"variables without a serve flag: {unknown}"
    # The same values given as flags: argparse checks choices, the settings builders check the rest.
    argv = ["serve"]
    for key, value in env.items():
        if to_flag[key] in ("--node-labels", "--openmp-env", "--allocations-pod-names", "--shared-pool",
                            "--uniform-groups"):  # booleans
            argv.append(to_flag[key] if value == "true" else "--no-" + to_flag[key][2:])
        else:
            argv += [to_flag[key], value]
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the env twins must parse too (booleans are read at parser build time)
    args = cli.build_parser().parse_args(argv)
    assert args.kubelet_dir == "/var/lib/kubelet/device-plugins"
    assert args.allocations_pod_names is True
    assert grouping_settings(args).exclude_polarization == frozenset({"vertical:low"})
    allocation_settings(args)


def test_image_tag_defaults_to_app_version_and_digest_wins(render: Render) -> None:
    assert agent_container(render())["image"] == f"s390x-topology-agent:{semver(__version__)}"
    digest = "sha256:" + "a" * 64
    container = agent_container(render("--set", "image.repository=quay.io/x/agent", "--set", f"image.digest={digest}"))
    assert container["image"] == f"quay.io/x/agent@{digest}"


def test_the_chart_mounts_the_nri_socket_for_nri_and_auto_and_the_cri_socket_with_it(render: Render) -> None:
    assert "nri-socket" not in mounts_of(render("--set", "cpusetEnforcement=cri"))
    docs = render("--set", "cpusetEnforcement=nri", "--set", "nriSocket=/run/nri/nri.sock")
    mounts = mounts_of(docs)
    mount, volume = mounts["nri-socket"]
    assert volume["hostPath"] == {"path": "/run/nri", "type": "DirectoryOrCreate"}
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_NRI_SOCKET"] == f"{mount['mountPath']}/nri.sock"
    assert env["TOPOLOGY_AGENT_CPUSET_ENFORCEMENT"] == "nri" and mounts["kubelet-root"][0]["readOnly"] is True
    # nri reads back over CRI what the runtime applied (a lost update, another plugin's override)
    assert env["TOPOLOGY_AGENT_CRI_SOCKET"] == f"{mounts['cri-socket'][0]['mountPath']}/containerd.sock"
    auto = mounts_of(render("--set", "cpusetEnforcement=auto"))
    assert {"nri-socket", "cri-socket", "kubelet-root"} <= auto.keys()
    assert auto["nri-socket"][1]["hostPath"]["path"] == "/var/run/nri"


# --------------------------------------------------------------------------------------------- fake topology


def test_fake_topology_mode(render: Render) -> None:
    docs = render(*FAKE_ARGS, "--set-json", 'nodeSelector={"kubernetes.io/arch":"s390x","pool":"e2e"}')
    config_map = one(docs, "ConfigMap")
    assert sorted(config_map["data"]) == ["default.json", "worker2.json"]
    from agent.topology import snapshot_format as snapshot

    topology = snapshot.loads(config_map["data"]["default.json"])  # a valid snapshot survives templating
    assert topology == snapshot.load(REPO / "agent/data/z16-lpar.json")
    ds = one(docs, "DaemonSet")
    pod_spec = ds["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "e2e"}  # only the arch key is dropped
    mounts = mounts_of(docs)
    mount, volume = mounts["fake-topology"]
    assert mount["readOnly"] is True
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert "host-sys" not in mounts
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_TOPOLOGY_FILE"] == mount["mountPath"]
    assert "TOPOLOGY_AGENT_HOST_ROOT" not in env
    assert "checksum/fake-topology" in ds["spec"]["template"]["metadata"]["annotations"]
    assert "device-plugins" in mounts  # the kubelet side stays real


def test_fake_topology_without_arch_selector_default(render: Render) -> None:
    pod_spec = one(render(*FAKE_ARGS), "DaemonSet")["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod_spec


def test_fake_topology_needs_snapshots(template_error: Callable[..., str]) -> None:
    stderr = template_error("--set", "fakeTopology.enabled=true")
    assert "fakeTopology.snapshots" in stderr


ENFORCEMENTS = ("none", "cri", "nri", "auto")


def mounted_with(render: Render, volume: str) -> set[tuple[str, bool]]:
    """The (cpusetEnforcement, kubelet.readState) pairs under which the chart mounts this volume."""
    return {(mode, read) for mode in ENFORCEMENTS for read in (False, True)
            if volume in mounts_of(render("--set", f"cpusetEnforcement={mode}",
                                          "--set", f"kubelet.readState={str(read).lower()}"))}


def prose(path: str) -> str:
    """A file's text with comment markers and line breaks folded, so a sentence reads as one line."""
    text = (REPO / path).read_text(encoding="utf-8")
    return " ".join(line.strip().lstrip("#").strip() for line in text.splitlines())


def test_the_docs_say_when_the_kubelet_root_is_mounted(render: Render) -> None:
    """The kubelet root exposes the node's pod volumes: every page that says when it is mounted says what renders."""
    mounted = mounted_with(render, "kubelet-root")
    (row,) = [line for line in (REPO / "docs/admin/configuration.md").read_text().splitlines()
              if line.startswith("| `kubelet.readState` |")]
    mode, read = re.findall(r"only `(\w+)` with `(\w+)` keeps them out", row)[0]
    assert {(m, r) for m in ENFORCEMENTS for r in (False, True)} - mounted == {(mode, read == "true")}
    assert "the default `auto` too" in row and ("auto", False) in mounted  # the default mounts it
    (but,) = re.findall(r"`kubelet\.readState` or any `cpusetEnforcement` but `(\w+)`", prose("docs/admin/security.md"))
    values = prose("deploy/helm/s390x-topology-agent/values.yaml")
    (only,) = re.findall(r"This value matters only with cpusetEnforcement (\w+)", values)
    assert but == only == mode
    assert re.findall(r"the kubelet root with kubelet\.readState or any cpusetEnforcement but (\w+)", values) == [mode]


def test_the_values_comment_says_when_the_runtime_socket_is_mounted(render: Render) -> None:
    said = re.findall(r"its directory is mounted only when this is ((?:\"\w+\"(?:, | or )?)+)",
                      prose("deploy/helm/s390x-topology-agent/values.yaml"))
    assert said, "the cpusetEnforcement comment no longer says when the CRI socket's directory is mounted"
    assert set(re.findall(r"\"(\w+)\"", said[0])) == {mode for mode, _ in mounted_with(render, "cri-socket")}

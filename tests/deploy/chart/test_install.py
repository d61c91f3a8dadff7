"""``helm install --dry-run=server`` against a fake API server: NOTES.txt by the namespace's pod security and the
cluster's version, and the install path of docs/admin/install.md and the README, run word for word."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable

import yaml

from tests.support.chart import (
    BOTH,
    FLOOR,
    NETPOL_ARGS,
    PRIVILEGED,
    Installed,
    Render,
    agent_container,
    chart_install,
    one,
    policies,
)
from tests.support.env import REPO


def test_notes_say_nothing_about_pod_security_where_the_namespace_is_privileged(
        install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "topo"), namespaces={"topo": PRIVILEGED}).notes
    assert "POD SECURITY" not in notes and "privileged" not in notes


def test_notes_warn_when_the_namespace_enforces_a_lower_level(install: Callable[..., Installed]) -> None:
    for level in ("baseline", "restricted"):
        notes = install(*chart_install("-n", "topo"), namespaces={
            "topo": {"pod-security.kubernetes.io/enforce": level, "kubernetes.io/metadata.name": "topo"}}).notes
        assert f'The namespace topo enforces "{level}": the API server will refuse every agent pod' in notes
        assert "kubectl label namespace topo pod-security.kubernetes.io/enforce=privileged --overwrite" in notes


def test_notes_explain_an_unlabelled_namespace(install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "kube-system"), namespaces={"kube-system": {}}).notes
    assert "The namespace kube-system has no pod-security.kubernetes.io/enforce label" in notes
    assert "kubectl label namespace kube-system pod-security.kubernetes.io/enforce=privileged" in notes


def test_notes_ask_for_privileged_when_the_namespace_cannot_be_read(install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "new-ns", "--create-namespace"), namespaces={}).notes
    assert 'the agent needs the "privileged" Pod Security level' in notes
    assert "Helm could not read the namespace new-ns" in notes
    assert "kubectl label namespace new-ns pod-security.kubernetes.io/enforce=privileged --overwrite" in notes


def test_a_live_cluster_without_the_policy_api_gets_no_policies_and_a_warning(
        install: Callable[..., Installed]) -> None:
    off = install(*chart_install("-n", "topo"), vap=False, namespaces={"topo": PRIVILEGED})
    assert policies(off.manifest) == set()
    assert "WARNING: no node-restriction policy was rendered (the cluster does not serve" in off.notes
    assert "may patch every Node of the cluster" in off.notes
    new = install(*chart_install("-n", "topo"), minor=37, namespaces={"topo": PRIVILEGED})
    assert policies(new.manifest) == BOTH
    assert "lets each agent update only its own Node" in new.notes and "WARNING" not in new.notes


def test_notes_list_what_to_check(install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "topo", "--set", "metrics.port=9555"), namespaces={"topo": PRIVILEGED}).notes
    assert "kubectl -n topo rollout status daemonset/t-s390x-topology-agent" in notes
    assert "get pods -l app.kubernetes.io/name=s390x-topology-agent,app.kubernetes.io/instance=t -o wide" in notes
    assert "kubectl get nodes -l kubernetes.io/arch=s390x" in notes
    assert "{.status.allocatable}" in notes and "topology/book" in notes
    assert "curl localhost:9555/readyz" in notes
    assert "kubectl get nodes -L topology.s390x.ibm.com/machine" in notes
    assert "seccomp-profile" not in notes and "NetworkPolicy" not in notes
    notes = install(*chart_install("-n", "topo", *NETPOL_ARGS, "--set", "seccompProfile.install=true",
                                   "--set", "agent.nodeLabels=false"), namespaces={"topo": PRIVILEGED}).notes
    assert "kubectl -n topo logs <agent pod> -c seccomp-profile" in notes
    assert "/var/lib/kubelet/seccomp/profiles/vllm-numa.json" in notes
    assert "localhostProfile: profiles/vllm-numa.json" in notes
    assert "The NetworkPolicy t-s390x-topology-agent admits only the scraper to port 9400" in notes
    assert "topology.s390x.ibm.com/machine" not in notes and "node-restriction" not in notes


# --- the install path (docs/admin/install.md, and the README's five-minute copy), without a registry and a cluster

README_DIGEST = "sha256:" + "0123456789abcdef" * 4  # what `docker buildx imagetools inspect` would print
INSTALL_DOC = REPO / "docs" / "admin" / "install.md"
README = REPO / "README.md"


def install_block(text: str, heading: str) -> str:
    """The first ```sh block after ``heading``."""
    section = text[text.index(heading):]
    start = section.index("```sh\n") + 6
    return section[start:section.index("\n```", start)]


def readme_install_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The shell block of docs/admin/install.md "## Installing": its variables and its commands, expanded as sh
    would. The README's five-minute install is the same block, word for word.

    $(...) substitutions are the registry's answer, which no test has: DIGEST gets README_DIGEST.
    """
    block = install_block(INSTALL_DOC.read_text(encoding="utf-8"), "## Installing\n")
    assert install_block(README.read_text(encoding="utf-8"), "## Five-minute install\n") == block
    variables: dict[str, str] = {}

    def expand(word: str) -> str:
        return re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: variables[m.group(1)], word)

    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        assignment = re.fullmatch(r"([A-Z_]+)=(.*)", line.strip())
        if assignment:
            name, value = assignment.group(1), assignment.group(2)
            variables[name] = (README_DIGEST if value.startswith("$(")
                               else expand(shlex.split(value, comments=True)[0]))
            continue
        commands.append([expand(word) for word in shlex.split(line, comments=True)])
    return variables, commands


def readme_helm_install() -> list[str]:
    (install,) = [c for c in readme_install_commands()[1] if c[:2] == ["helm", "install"]]
    return install


def test_readme_install_renders_the_pushed_image_by_digest(helm: str) -> None:
    variables, _ = readme_install_commands()
    args = readme_helm_install()
    repository = f"{variables['REGISTRY']}/s390x-topology-agent"
    assert f"image.repository={repository}" in args and f"image.digest={README_DIGEST}" in args
    # The digest is read from the very image the chart is pointed at (the manifest list make image pushed).
    assert 'DIGEST=$(docker buildx imagetools inspect "$REGISTRY/s390x-topology-agent:$TAG"' in INSTALL_DOC.read_text()
    # The documented exact flags, only `install` turned into `template` (with a Kubernetes version, which `install`
    # reads from the cluster), run from the repository root as written.
    result = subprocess.run([helm, "template", *args[2:], "--kube-version", FLOOR,
                             "--set", "seccompProfile.install=true"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    expected = f"{repository}@{README_DIGEST}"
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"] + pod["initContainers"]] == [expected, expected]
    assert one(docs, "DaemonSet")["metadata"]["namespace"] == args[args.index("-n") + 1]


def test_readme_install_path_against_a_fake_cluster(install: Callable[..., Installed]) -> None:
    """The documented namespace and label, then its exact `helm install`: no Pod Security warning, the image."""
    variables, commands = readme_install_commands()
    (label,) = [c for c in commands if c[:3] == ["kubectl", "label", "namespace"]]
    namespace = label[3]
    assert ["kubectl", "create", "namespace", namespace] in commands
    labels = dict(pair.split("=", 1) for pair in label[4:])
    args = readme_helm_install()
    released = install(*args[1:], namespaces={namespace: labels})
    expected = f"{variables['REGISTRY']}/s390x-topology-agent@{README_DIGEST}"
    assert agent_container(released.manifest)["image"] == expected
    assert f"(image {expected})" in released.notes
    assert "POD SECURITY" not in released.notes
    assert policies(released.manifest) == BOTH


def test_readme_tag_alternative(render: Render) -> None:
    variables, _ = readme_install_commands()
    assert '`--set image.tag="$TAG"` instead of the digest' in INSTALL_DOC.read_text(encoding="utf-8")
    container = agent_container(render("--set", f"image.repository={variables['REGISTRY']}/s390x-topology-agent",
                                       "--set", f"image.tag={variables['TAG']}"))
    assert container["image"] == f"{variables['REGISTRY']}/s390x-topology-agent:{variables['TAG']}"

{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "topology-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart, or the release name when it already holds the chart name. */}}
{{- define "topology-agent.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "topology-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "topology-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topology-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "topology-agent.labels" -}}
helm.sh/chart: {{ include "topology-agent.chart" . }}
{{ include "topology-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "topology-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "topology-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is pinned (releases should pin the manifest-list digest). */}}
{{- define "topology-agent.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The extended-resource prefix with its slash: "topology/". */}}
{{- define "topology-agent.resourcePrefix" -}}
{{- printf "%s/" .Values.agent.resourcePrefix }}
{{- end }}

{{/* Host paths under the kubelet root (microk8s and k0s use other roots); the device-plugin directory is not one. */}}
{{- define "topology-agent.kubeletRoot" -}}
{{- .Values.kubelet.root | trimSuffix "/" }}
{{- end }}

{{/* Where the container sees kubelet's directories: fixed, whatever the host's kubelet root is. */}}
{{- define "topology-agent.containerDevicePluginDir" -}}/var/lib/kubelet/device-plugins{{- end }}
{{- define "topology-agent.containerPodResourcesDir" -}}/var/lib/kubelet/pod-resources{{- end }}
{{- define "topology-agent.containerKubeletRoot" -}}/host/kubelet{{- end }}
{{- define "topology-agent.snapshotDir" -}}/etc/topology-agent/snapshots{{- end }}

{{/*
Whether the cluster serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (GA in Kubernetes 1.30, so on
every minor of the chart's kubeVersion). `helm install`/`upgrade` see the cluster's discovery, kinds included
("apps/v1/DaemonSet"), and are trusted as they are: a cluster that does not list the kind (its API server has it
switched off) does not get the policies. Offline (`helm template`, as GitOps tools run it) Helm knows
group/versions only, never kinds, so the kind is missing there even on a cluster that serves it: then the chart's
kubeVersion, which --kube-version has passed, answers yes.
*/}}
{{- define "topology-agent.admissionApiServed" -}}
{{- $api := .Capabilities.APIVersions -}}
{{- if or ($api.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (not ($api.Has "apps/v1/DaemonSet")) -}}
true
{{- end -}}
{{- end }}

{{/*
Whether the pod-request ValidatingAdmissionPolicy is rendered: enabled, and either forced or the API is served
(topology-agent.admissionApiServed).
*/}}
{{- define "topology-agent.admissionPolicyEnabled" -}}
{{- $p := .Values.admissionPolicy -}}
{{- if and $p.enabled (or $p.force (include "topology-agent.admissionApiServed" .)) -}}
true
{{- end -}}
{{- end }}

{{/* DRA mode (mode: dra): ResourceSlices and a kubelet DRA plugin instead of the device-plugin API. */}}
{{- define "topology-agent.dra" -}}
{{- if eq (.Values.mode | default "deviceplugin") "dra" -}}true{{- end -}}
{{- end }}

{{/* The DRA driver name (agent/policy/resource_slices.py DRIVER), and the kubelet plugin directory on the host. */}}
{{- define "topology-agent.draDriver" -}}topology.s390x.ibm.com{{- end }}
{{- define "topology-agent.draPluginDir" -}}
{{- printf "%s/plugins/%s" (include "topology-agent.kubeletRoot" .) (include "topology-agent.draDriver" .) -}}
{{- end }}

{{/* Whether the agent calls the API server at all: node labels, or DRA mode (its ResourceSlices and claims). */}}
{{- define "topology-agent.apiAccess" -}}
{{- if or .Values.agent.nodeLabels (include "topology-agent.dra" .) -}}true{{- end -}}
{{- end }}

{{/*
Whether the agent evicts stranded holders' pods (strandedPolicy evict): with cpuset enforcement and API access only
(without a token it keeps them, as with strandedPolicy keep).
*/}}
{{- define "topology-agent.evictStranded" -}}
{{- if and (has .Values.cpusetEnforcement (list "cri" "nri" "auto")) (eq (.Values.strandedPolicy | default "evict") "evict") (include "topology-agent.apiAccess" .) -}}true{{- end -}}
{{- end }}

{{/* The domain of the agent's node labels and annotations (agent/node/labels.py KEY_PREFIX). */}}
{{- define "topology-agent.nodeKeyPrefix" -}}topology.s390x.ibm.com/{{- end }}

{{/*
Whether the node-restriction ValidatingAdmissionPolicy is rendered: enabled, the agent labels its Node (otherwise
it has no RBAC and no token), and the API is served or admissionPolicy.force is set.
*/}}
{{- define "topology-agent.nodeRestrictionPolicyEnabled" -}}
{{- if and .Values.nodeRestrictionPolicy.enabled (include "topology-agent.apiAccess" .) (or .Values.admissionPolicy.force (include "topology-agent.admissionApiServed" .)) -}}
true
{{- end -}}
{{- end }}

{{/*
Whether helm uninstall cleans the nodes up (uninstall.cleanup): the pre-delete hook (templates/uninstall-hook.yaml)
and the agent's look at its DaemonSet need an API token (topology-agent.apiAccess) and the chart's RBAC.
*/}}
{{- define "topology-agent.uninstallCleanup" -}}
{{- if and .Values.uninstall.cleanup .Values.rbac.create (include "topology-agent.apiAccess" .) -}}true{{- end -}}
{{- end }}

{{/* The node selector of the agent's pods (fake-topology mode drops the arch key). */}}
{{- define "topology-agent.nodeSelector" -}}
{{- $nodeSelector := .Values.nodeSelector | default dict -}}
{{- if .Values.fakeTopology.enabled -}}
{{- $nodeSelector = omit $nodeSelector "kubernetes.io/arch" -}}
{{- end -}}
{{- toJson $nodeSelector -}}
{{- end }}

{{/*
Whether the chart installs its SecurityContextConstraints (OpenShift, openshift.scc.create): true, or auto where the
cluster serves security.openshift.io/v1 (helm install reads discovery; helm template knows it from --api-versions).
*/}}
{{- define "topology-agent.scc" -}}
{{- $create := toString .Values.openshift.scc.create -}}
{{- if or (eq $create "true") (and (eq $create "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) -}}true{{- end -}}
{{- end }}

{{/*
The SELinux type of the agent's pods under the SCC (openshift.scc.seLinuxType, else the narrowest that does the job).
container-selinux's container.te: container_device_plugin_t may read and write sysfs and connect to kubelet's sockets
(device-plugins, pod-resources), nothing of the runtime's (the CRI and NRI sockets are container_runtime_t's) or
kubelet's root; spc_t, the super-privileged container type, is confined by nothing of SELinux.
*/}}
{{- define "topology-agent.seLinuxType" -}}
{{- if .Values.openshift.scc.seLinuxType -}}
{{- .Values.openshift.scc.seLinuxType -}}
{{- else if and (eq .Values.cpusetEnforcement "none") (not .Values.kubelet.readState) (not (include "topology-agent.dra" .)) (not .Values.seccompProfile.install) -}}
container_device_plugin_t
{{- else -}}
spc_t
{{- end -}}
{{- end }}

{{/*
Values across releases (compat.yaml): every template includes this first. It fills in the keys added since the last
release where the values lack them (helm upgrade --reuse-values renders with the old chart's defaults) and carries a
renamed key's value to its new name. Idempotent; it changes .Values, which every template shares.
*/}}
{{- define "topology-agent.compat" -}}
{{- $compat := .Files.Get "compat.yaml" | fromYaml -}}
{{- include "topology-agent.fill" (list .Values ($compat.added | default dict)) -}}
{{- range $rename := $compat.renamed -}}
{{- $old := include "topology-agent.valueAt" (list $.Values $rename.old) | fromYaml -}}
{{- $new := include "topology-agent.valueAt" (list $.Values $rename.new) | fromYaml -}}
{{- if and $old.found (or (not $new.found) (eq (toJson $new.value) (toJson $rename.default))) -}}
{{- $values := $.Values -}}
{{- $parts := splitList "." $rename.new -}}
{{- range $part := initial $parts -}}
{{- if not (kindIs "map" (get $values $part)) -}}{{- $_ := set $values $part dict -}}{{- end -}}
{{- $values = get $values $part -}}
{{- end -}}
{{- $_ := set $values (last $parts) $old.value -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
(list values defaults): every key of defaults that values lack, added to values, at any depth. Unlike sprig's merge,
a key the values have keeps its value even when it is false, 0 or "".
*/}}
{{- define "topology-agent.fill" -}}
{{- $values := index . 0 -}}
{{- range $key, $default := index . 1 -}}
{{- if not (hasKey $values $key) -}}
{{- $_ := set $values $key (deepCopy $default) -}}
{{- else if and (kindIs "map" $default) (kindIs "map" (get $values $key)) -}}
{{- include "topology-agent.fill" (list (get $values $key) $default) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
(list values "a.b.c") -> YAML {found: bool, value: ...}: the value at a dotted path of the values.
*/}}
{{- define "topology-agent.valueAt" -}}
{{- $here := index . 0 -}}
{{- $found := true -}}
{{- range $part := splitList "." (index . 1) -}}
{{- if and $found (kindIs "map" $here) (hasKey $here $part) -}}
{{- $here = get $here $part -}}
{{- else -}}
{{- $found = false -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "found" $found "value" (ternary $here nil $found)) -}}
{{- end }}

{{/*
caa.validate fails the render, naming the value and the fix, on settings
that cannot work. Every template includes it, so no partial render slips
through.
*/}}
{{- define "caa.validate" -}}
{{- range $name, $v := dict "surge" .Values.surge "credentials.create" .Values.credentials.create "createNamespace" .Values.createNamespace "hypervisor.enabled" .Values.hypervisor.enabled "hypervisor.pullSecrets" .Values.hypervisor.pullSecrets "relay.enabled" .Values.relay.enabled "clusterScope.enabled" .Values.clusterScope.enabled "clusterScope.controlPlaneOnly" .Values.clusterScope.controlPlaneOnly "adaptorConfig.enabled" .Values.adaptorConfig.enabled -}}
{{- if not (kindIs "bool" $v) -}}
{{- fail (printf "%s=%v: must be true or false (a boolean: --set, not --set-string)" $name $v) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.createNamespace (eq (include "caa.namespace" .) .Release.Namespace) -}}
{{- fail (printf "createNamespace=true would make the release's own namespace %q a release object, which Helm cannot install (it stores the release there first): install with `helm install --create-namespace` and no createNamespace, or set namespaceOverride to another namespace for the chart's objects" .Release.Namespace) -}}
{{- end -}}
{{- if and .Values.credentials.create (empty .Values.credentials.data) -}}
{{- fail "credentials.create=true needs credentials.data: the Secret's keys, the cloud's environment variables (AWS_ACCESS_KEY_ID, AZURE_CLIENT_SECRET, IBMCLOUD_API_KEY, ...); or leave credentials.create=false and create the Secret credentials.secretName yourself" -}}
{{- end -}}
{{- if not .Values.credentials.secretName -}}
{{- fail "credentials.secretName is empty: name the Secret that holds the cloud credentials (caa-cloud-credentials)" -}}
{{- end -}}
{{- $clouds := list "aws" "azure" "ibmcloud" -}}
{{- if not (has .Values.cloud $clouds) -}}
{{- fail (printf "cloud=%q: set cloud to aws, azure or ibmcloud (install with -f values-<cloud>.yaml)" (toString .Values.cloud)) -}}
{{- end -}}
{{- $routes := dict "secret" "" "aws-pod-identity" "aws" "aws-irsa" "aws" "azure-workload-identity" "azure" "azure-managed-identity" "azure" "ibmcloud-trusted-profile" "ibmcloud" -}}
{{- $route := toString .Values.identity.route -}}
{{- if not (hasKey $routes $route) -}}
{{- fail (printf "identity.route=%q: use one of secret, aws-pod-identity, aws-irsa, azure-workload-identity, azure-managed-identity, ibmcloud-trusted-profile" $route) -}}
{{- end -}}
{{- $for := get $routes $route -}}
{{- if and $for (ne $for .Values.cloud) -}}
{{- fail (printf "identity.route=%s is a route of cloud %s, not of cloud=%s" $route $for .Values.cloud) -}}
{{- end -}}
{{- if and (eq $route "aws-irsa") (not .Values.identity.awsRoleArn) -}}
{{- fail "identity.route=aws-irsa needs identity.awsRoleArn (the IAM role's ARN)" -}}
{{- end -}}
{{- if and (eq $route "azure-workload-identity") (not .Values.identity.azureClientId) -}}
{{- fail "identity.route=azure-workload-identity needs identity.azureClientId (the identity's client id)" -}}
{{- end -}}
{{- if and (eq $route "ibmcloud-trusted-profile") (not .Values.identity.ibmcloudProfileId) -}}
{{- fail "identity.route=ibmcloud-trusted-profile needs identity.ibmcloudProfileId (the trusted profile's id)" -}}
{{- end -}}
{{- if and .Values.relay.enabled (not .Values.hypervisor.enabled) -}}
{{- fail "relay.enabled=true needs hypervisor.enabled=true: the relay serves the agent sockets of kata's remote hypervisor mode" -}}
{{- end -}}
{{- if and .Values.adaptorConfig.enabled (not .Values.hypervisor.enabled) -}}
{{- fail "adaptorConfig.enabled=true needs hypervisor.enabled=true: the adaptor's settings are those of kata's remote hypervisor (install with -f values-adaptor.yaml)" -}}
{{- end -}}
{{- if and .Values.adaptorConfig.enabled (not .Values.adaptorConfig.configMap) -}}
{{- fail "adaptorConfig.configMap is empty: name the adaptor's ConfigMap (peer-pods-cm)" -}}
{{- end -}}
{{- if and .Values.hypervisor.enabled .Values.hypervisor.pullSecrets -}}
{{- range $name, $v := dict "hypervisor.kubeletKubeconfig" .Values.hypervisor.kubeletKubeconfig "hypervisor.kubeletCertDir" .Values.hypervisor.kubeletCertDir -}}
{{- if not (hasPrefix "/" (toString $v)) -}}
{{- fail (printf "%s=%q: give the host path of the node's kubelet file (an absolute path), or set hypervisor.pullSecrets=false" $name (toString $v)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .Values.cloudSettings -}}
{{- if not (hasPrefix (printf "CAA_%s_" (upper $.Values.cloud)) $k) -}}
{{- fail (printf "cloudSettings.%s is not a setting of cloud=%s (its keys are CAA_%s_*; common settings go under settings, and cloud sets CAA_PROVIDER)" $k $.Values.cloud (upper $.Values.cloud)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
caa.namespace is the namespace of every namespaced object: the release's,
unless namespaceOverride names another.
*/}}
{{- define "caa.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/*
caa.tag is the image tag: image.tag, else the chart's appVersion with the
cloud's suffix (the one-cloud build `make image CLOUDS=<cloud>` tags).
*/}}
{{- define "caa.tag" -}}
{{- default (printf "%s-%s" .Chart.AppVersion .Values.cloud) .Values.image.tag -}}
{{- end -}}

{{/* caa.image is the image every container runs: the one-cloud build. */}}
{{- define "caa.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "caa.tag" .) -}}
{{- with .Values.image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{/*
caa.labelSet are Kubernetes' recommended labels, from (list $ name
component). name, part-of and component are those of deploy/ (kustomize);
the rest are Helm's.
*/}}
{{- define "caa.labelSet" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ index . 1 }}
app.kubernetes.io/part-of: caa
app.kubernetes.io/component: {{ index . 2 }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/version: {{ include "caa.tag" $ | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* caa.labels are the labels of caa's node agent and what it shares. */}}
{{- define "caa.labels" -}}
{{- include "caa.labelSet" (list . "caa" "node-agent") -}}
{{- end -}}

{{/*
caa.podLabels are a pod template's labels from (list $ name): podLabels,
the release, and the name the selector matches (which wins).
*/}}
{{- define "caa.podLabels" -}}
{{- $ := index . 0 -}}
{{- $l := merge (dict "app.kubernetes.io/name" (index . 1) "app.kubernetes.io/instance" $.Release.Name) $.Values.podLabels -}}
{{- toYaml $l -}}
{{- end -}}


{{/* caa.config is the ConfigMap's data: common settings, then the cloud's. */}}
{{- define "caa.config" -}}
{{- $data := dict "CAA_PROVIDER" .Values.cloud -}}
{{- if .Values.clusterScope.enabled }}{{ $_ := set $data "CAA_CLUSTER_VIEW" "true" }}{{ end -}}
{{- range $k, $v := .Values.settings }}{{ $_ := set $data $k (toString $v) }}{{ end -}}
{{- if not .Values.adaptorConfig.enabled -}}
{{- range $k, $v := .Values.cloudSettings }}{{ $_ := set $data $k (toString $v) }}{{ end -}}
{{- end -}}
{{- range $k := keys $data | sortAlpha }}
{{ $k }}: {{ get $data $k | quote }}
{{- end -}}
{{- end -}}

{{/* caa.usesSecret: the routes that read the Secret credentials.secretName. */}}
{{- define "caa.usesSecret" -}}
{{- if and (eq (toString .Values.identity.route) "secret") (not .Values.adaptorConfig.enabled) }}true{{ end -}}
{{- end -}}

{{/* The release's full name: the release name when it holds the chart name. */}}
{{- define "dcgm-enricher.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace of every namespaced object: namespace.name, else the release's. */}}
{{- define "dcgm-enricher.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{/* The name of every cluster-scoped object (ClusterRole, ClusterRoleBinding, the OpenShift
SCC): the full name and the namespace, so that releases of one name in two namespaces never
share one. */}}
{{- define "dcgm-enricher.clusterName" -}}
{{- printf "%s-%s" (include "dcgm-enricher.fullname" .) (include "dcgm-enricher.namespace" .) -}}
{{- end -}}

{{/* The Service's name inside the cluster, the name Prometheus checks in the certificate. */}}
{{- define "dcgm-enricher.serviceHost" -}}
{{- printf "%s.%s.svc" (include "dcgm-enricher.fullname" .) (include "dcgm-enricher.namespace" .) -}}
{{- end -}}

{{- define "dcgm-enricher.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Helm's own labels; tests/test_chart.py ignores exactly these when it compares. */}}
{{- define "dcgm-enricher.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The labels manifests/ puts on its objects, plus Helm's. */}}
{{- define "dcgm-enricher.labels" -}}
{{ include "dcgm-enricher.helmLabels" . }}
app.kubernetes.io/name: {{ include "dcgm-enricher.name" . }}
app.kubernetes.io/part-of: dcgm-enricher
{{- end -}}

{{- define "dcgm-enricher.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dcgm-enricher.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Where the web config and its certificates are mounted (webConfig). */}}
{{- define "dcgm-enricher.webConfigDir" -}}/etc/dcgm-enricher/web{{- end -}}

{{/* "true" when the enricher serves with a web config (TLS, basic auth or a Secret of the
user's), else "". */}}
{{- define "dcgm-enricher.webConfig" -}}
{{- $web := .Values.webConfig -}}
{{- if or $web.tls.secretName $web.basicAuthUsers $web.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* The enricher's flags as JSON: the mode's defaults, then enricher.flags (null drops one). */}}
{{- define "dcgm-enricher.flags" -}}
{{- $flags := dict "web.listen-address" (printf ":%v" .Values.enricher.port) "upstream.url" (printf "http://127.0.0.1:%v/metrics" .Values.exporter.port) -}}
{{- if eq .Values.mode "gpu-operator" -}}
{{- $_ := set $flags "upstream.discover-pod" true -}}
{{- $_ := set $flags "upstream.pod-selector" "app=nvidia-dcgm-exporter" -}}
{{- /* The operator's namespace is the pod's own: the kubelet expands $(POD_NAMESPACE). */ -}}
{{- $_ := set $flags "upstream.pod-namespace" "$(POD_NAMESPACE)" -}}
{{- /* The operator runs the MPS control daemon in the same namespace, with this label. */ -}}
{{- $_ := set $flags "mps.daemon-pod-selector" "app=nvidia-device-plugin-mps-control-daemon" -}}
{{- $_ := set $flags "mps.daemon-pod-namespace" "$(POD_NAMESPACE)" -}}
{{- end -}}
{{- if ne (int .Values.enricher.runAsUser) 0 -}}
{{- /* Non-root cannot connect to the kubelet's root-only PodResources socket. */ -}}
{{- $_ := set $flags "kubelet.enabled" false -}}
{{- end -}}
{{- if not .Values.dra.enabled -}}
{{- $_ := set $flags "kube.resource-slices" false -}}
{{- end -}}
{{- if include "dcgm-enricher.webConfig" . -}}
{{- $_ := set $flags "web.config.file" (printf "%s/web-config.yml" (include "dcgm-enricher.webConfigDir" .)) -}}
{{- end -}}
{{- range $name, $value := .Values.enricher.flags -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $flags $name -}}
{{- else -}}
{{- $_ := set $flags $name $value -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.dra.enabled) (eq (index $flags "kube.resource-slices" | toString) "true") -}}
{{- fail "dra.enabled: false drops the ClusterRole's resourceslices rule; enricher.flags.kube.resource-slices: true would only be refused by the API server" -}}
{{- end -}}
{{- toJson $flags -}}
{{- end -}}

{{/* "true" when the enricher reads the kubelet's PodResources socket (its mount), else "". */}}
{{- define "dcgm-enricher.kubeletSource" -}}
{{- $flags := include "dcgm-enricher.flags" . | fromJson -}}
{{- if ne (index $flags "kubelet.enabled" | toString) "false" -}}true{{- end -}}
{{- end -}}

{{/* The enricher's args: serve, --web.listen-address, then every other flag in key order. */}}
{{- define "dcgm-enricher.args" -}}
{{- $flags := include "dcgm-enricher.flags" . | fromJson -}}
{{- $args := list "serve" -}}
{{- $listen := index $flags "web.listen-address" | default "" -}}
{{- if $listen -}}
{{- $args = append $args (printf "--web.listen-address=%v" $listen) -}}
{{- end -}}
{{- range $name := keys $flags | sortAlpha -}}
{{- if ne $name "web.listen-address" -}}
{{- $value := index $flags $name -}}
{{- if kindIs "bool" $value -}}
{{- $args = append $args (ternary (printf "--%s" $name) (printf "--no-%s" $name) $value) -}}
{{- else if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) -}}
{{- /* Helm reads every number as float64: 33554432 must not render as 3.3554432e+07. */ -}}
{{- $args = append $args (printf "--%s=%d" $name (int64 $value)) -}}
{{- else -}}
{{- $args = append $args (printf "--%s=%v" $name $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{- define "dcgm-enricher.nodeSelector" -}}
{{- if kindIs "invalid" .Values.nodeSelector -}}
{{- if eq .Values.mode "gpu-operator" -}}
nvidia.com/gpu.deploy.dcgm-exporter: "true"
{{- else -}}
nvidia.com/gpu.present: "true"
{{- end -}}
{{- else -}}
{{- toYaml .Values.nodeSelector -}}
{{- end -}}
{{- end -}}

{{- define "dcgm-enricher.runtimeClassName" -}}
{{- if kindIs "invalid" .Values.runtimeClassName -}}
{{- if eq .Values.mode "gpu-operator" -}}nvidia{{- end -}}
{{- else -}}
{{- .Values.runtimeClassName -}}
{{- end -}}
{{- end -}}

{{/* A monitor endpoint's scheme, TLS, basic auth and metric relabelings (monitor.*): https
when the enricher serves TLS (webConfig.tls.secretName) unless monitor.scheme says otherwise.
The argument is the root context; .kind is read from .Values.monitor. */}}
{{- define "dcgm-enricher.endpointSecurity" -}}
{{- $monitor := .Values.monitor -}}
{{- $scheme := $monitor.scheme | default (ternary "https" "" (ne .Values.webConfig.tls.secretName "")) -}}
{{- if and (eq $monitor.kind "PodMonitor") (or $monitor.tlsConfig.caFile $monitor.tlsConfig.certFile $monitor.tlsConfig.keyFile) -}}
{{- fail "monitor.tlsConfig: caFile, certFile and keyFile are not PodMonitor fields (a PodMonitor's TLS comes from Secrets: ca, cert, keySecret)" -}}
{{- end -}}
{{- with $scheme }}
scheme: {{ . }}
{{- end }}
{{- /* With TLS on, Prometheus checks the certificate against the TLS Secret's own ca.crt and
the Service's name (<fullname>.<namespace>.svc), unless monitor.tlsConfig says otherwise. */ -}}
{{- $tls := deepCopy ($monitor.tlsConfig | default dict) -}}
{{- with .Values.webConfig.tls.secretName -}}
{{- if not (or (hasKey $tls "ca") (hasKey $tls "caFile")) -}}
{{- $_ := set $tls "ca" (dict "secret" (dict "name" . "key" "ca.crt")) -}}
{{- end -}}
{{- if not (hasKey $tls "serverName") -}}
{{- $_ := set $tls "serverName" (include "dcgm-enricher.serviceHost" $) -}}
{{- end -}}
{{- end -}}
{{- with $tls }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

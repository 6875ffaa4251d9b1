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

{{/* The enricher's args: serve, --web.listen-address, then every other flag in key order. */}}
{{- define "dcgm-enricher.args" -}}
{{- $flags := dict "web.listen-address" (printf ":%v" .Values.enricher.port) "upstream.url" (printf "http://127.0.0.1:%v/metrics" .Values.exporter.port) -}}
{{- if eq .Values.mode "gpu-operator" -}}
{{- $_ := set $flags "upstream.discover-pod" true -}}
{{- $_ := set $flags "upstream.pod-selector" "app=nvidia-dcgm-exporter" -}}
{{- /* The operator's namespace is the pod's own: the kubelet expands $(POD_NAMESPACE). */ -}}
{{- $_ := set $flags "upstream.pod-namespace" "$(POD_NAMESPACE)" -}}
{{- end -}}
{{- if ne (int .Values.enricher.runAsUser) 0 -}}
{{- /* Non-root cannot connect to the kubelet's root-only PodResources socket. */ -}}
{{- $_ := set $flags "kubelet.enabled" false -}}
{{- end -}}
{{- range $name, $value := .Values.enricher.flags -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $flags $name -}}
{{- else -}}
{{- $_ := set $flags $name $value -}}
{{- end -}}
{{- end -}}
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

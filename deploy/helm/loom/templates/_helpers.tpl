{{/* The chart's name, or nameOverride. */}}
{{- define "loom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name: the prefix of every object. */}}
{{- define "loom.fullname" -}}
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

{{- define "loom.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels; each object adds app.kubernetes.io/component. */}}
{{- define "loom.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "loom.labels" -}}
helm.sh/chart: {{ include "loom.chart" . }}
{{ include "loom.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: loom
{{- end }}

{{- define "loom.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* loomd's image: the CUDA variant (deploy/Dockerfile --build-arg CUDA=1) on GPU nodes. */}}
{{- define "loom.loomdImage" -}}
{{- if .Values.loomd.gpus -}}
{{ .Values.image.repository }}:{{ .Values.image.cudaTag | default (printf "%s-cuda" (.Values.image.tag | default .Chart.AppVersion)) }}
{{- else -}}
{{ include "loom.image" . }}
{{- end }}
{{- end }}

{{- define "loom.plannerName" -}}
{{ include "loom.fullname" . }}-planner
{{- end }}

{{/* Where loomd dials the planner: the Service's full DNS name. */}}
{{- define "loom.plannerAddress" -}}
{{ include "loom.plannerName" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:{{ .Values.planner.port }}
{{- end }}

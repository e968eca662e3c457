{{/* Labels and image of NVIDIA/gpu-operator@v26.3.3 deployments/gpu-operator/templates/_helpers.tpl:38-49,71-73
(our own template text; the labels are the facts). */}}
{{- define "gpu-operator.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpu-operator.fullimage" -}}
{{ .Values.operator.repository }}/{{ .Values.operator.image }}:{{ .Chart.AppVersion }}
{{- end -}}

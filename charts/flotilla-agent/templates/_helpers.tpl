{{/*
The name of every object of the release. With the release named flotilla-agent, as
`flotilla cluster add` suggests, it is flotilla-agent.
*/}}
{{- define "flotilla-agent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "flotilla-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "flotilla-agent.labels" -}}
{{ include "flotilla-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The port of agent.listen, which the probes use. The agent must listen on the pod's
address (":8080", not "127.0.0.1:8080") for the kubelet to reach it.
*/}}
{{- define "flotilla-agent.port" -}}
{{- regexFind "[0-9]+$" (.Values.agent.listen | default ":8080") | default "8080" -}}
{{- end -}}

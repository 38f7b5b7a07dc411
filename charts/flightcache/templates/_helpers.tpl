{{- define "flightcache.name" -}}flightcache-operator{{- end -}}

{{- define "flightcache.labels" -}}
app.kubernetes.io/name: flightcache-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "flightcache.selector" -}}
app.kubernetes.io/name: flightcache-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "flightcache.fullname" -}}{{ .Release.Name }}-operator{{- end -}}

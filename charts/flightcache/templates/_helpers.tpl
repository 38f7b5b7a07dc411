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

{{- /* The namespaces the operator watches, comma-separated (default: the release's). */ -}}
{{- define "flightcache.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}{{ join "," .Values.watchNamespaces }}{{ else }}{{ .Release.Namespace }}{{ end -}}
{{- end -}}

{{- define "flightcache.fullname" -}}{{ .Release.Name }}-operator{{- end -}}

{{- /*
Fails the render when a monitoring.coreos.com object is enabled but the cluster does not serve
that API (the Prometheus Operator CRDs are missing), unless monitoring.skipCapabilitiesCheck.
Argument: (list $ "monitoring.prometheusRule.enabled").
*/ -}}
{{- define "flightcache.requireMonitoringAPI" -}}
{{- $root := index . 0 -}}
{{- if not (or $root.Values.monitoring.skipCapabilitiesCheck ($root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) -}}
{{- fail (printf "%s is true, but the cluster does not serve monitoring.coreos.com/v1: install the Prometheus Operator CRDs first, turn %s off, or set monitoring.skipCapabilitiesCheck=true (e.g. for helm template without --api-versions monitoring.coreos.com/v1)" (index . 1) (index . 1)) -}}
{{- end -}}
{{- end -}}

{{- /*
Checks across values that the schema cannot express with a clear message; included by
deployment.yaml, so every render runs them.
*/ -}}
{{- define "flightcache.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection) -}}
{{- fail (printf "replicas is %d but leaderElection is false: unelected replicas would all reconcile the same CacheClusters; set leaderElection=true or replicas=1" (int .Values.replicas)) -}}
{{- end -}}
{{- $watched := splitList "," (include "flightcache.watchNamespaces" .) -}}
{{- $seen := dict -}}
{{- range $i, $cc := .Values.cacheClusters -}}
{{- $ns := $cc.namespace | default $.Release.Namespace -}}
{{- $key := printf "%s/%s" $ns $cc.name -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "cacheClusters[%d]: CacheCluster %s is listed twice" $i $key) -}}
{{- end -}}
{{- $_ := set $seen $key true -}}
{{- if not (or $.Values.clusterWide (has $ns $watched)) -}}
{{- fail (printf "cacheClusters[%d] (%s) is in namespace %s, which the operator does not watch (watchNamespaces: %s): add it to watchNamespaces or set clusterWide=true" $i $cc.name $ns (join "," $watched)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Helpers of the alerts (prometheusrule.yaml) and the dashboard
(dashboard.yaml).
*/}}

{{/*
The PromQL label matchers that select the controller's series:
prometheusRule.selector, else the job and namespace a ServiceMonitor of this
chart gives them (the metrics Service's name and namespace).
*/}}
{{- define "helm-autorecover.metricsSelector" -}}
{{- if .Values.prometheusRule.selector -}}
{{- .Values.prometheusRule.selector -}}
{{- else -}}
{{- printf "job=%q, namespace=%q" (printf "%s-metrics" (include "helm-autorecover.fullname" .) | trunc 63 | trimSuffix "-") .Release.Namespace -}}
{{- end -}}
{{- end -}}

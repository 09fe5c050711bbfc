{{/*
Names and labels shared by the templates, and the controller's RBAC rules.
*/}}

{{/* The chart's short name: nameOverride or the chart name. */}}
{{- define "helm-autorecover.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The base name of the objects: fullnameOverride, else the release name when
it already contains the chart's name, else "<release>-<name>". Cut to 63
characters, a DNS label.
*/}}
{{- define "helm-autorecover.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "helm-autorecover.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The name of RBAC objects that live outside the release's namespace
(ClusterRoles, ClusterRoleBindings, Roles in watched namespaces): the full
name and the release's namespace, so that installations in two namespaces
never claim the same object.
*/}}
{{- define "helm-autorecover.rbacName" -}}
{{- printf "%s-%s" (include "helm-autorecover.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "helm-autorecover.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the controller's pods; never change on upgrade. */}}
{{- define "helm-autorecover.selectorLabels" -}}
app.kubernetes.io/name: {{ include "helm-autorecover.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* Labels of every object. */}}
{{- define "helm-autorecover.labels" -}}
helm.sh/chart: {{ include "helm-autorecover.chart" . }}
{{ include "helm-autorecover.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: helm-autorecover
{{- end -}}

{{/* The ServiceAccount the controller runs as. */}}
{{- define "helm-autorecover.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "helm-autorecover.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespace of the leader-election Lease. */}}
{{- define "helm-autorecover.leaderElectionNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace -}}
{{- end -}}

{{/* The image, with the chart's appVersion as the default tag. */}}
{{- define "helm-autorecover.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The kind of object helm's records (and the lock's beats) are: secrets or
configmaps, after the driver.
*/}}
{{- define "helm-autorecover.recordResource" -}}
{{- if eq .Values.helmDriver "configmap" -}}configmaps{{- else -}}secrets{{- end -}}
{{- end -}}

{{/*
Rules the controller needs wherever it watches releases (cluster-wide in the
ClusterRole, or in each listed namespace's Role):
- helm's records and the lock's beat objects (helm-autorecover.v1.<release>)
  of the driver's kind: read and watched to find pending releases, written
  to take the lock and mark revisions failed, deleted as helm deletes them;
- the per-release lock Leases, unless lockBackend=release;
- Events about recoveries;
- hook Jobs and Pods, read (get; list for a hook named by generateName)
  before a revision stock helm left pending is recovered: one still
  running means its helm may still be at work;
- the recovery rules (rbac.recoveryRules), plus create for
  recoverStrategy=rollback and delete on persistentvolumeclaims for
  recoverDeleteData=true.
*/}}
{{- define "helm-autorecover.watchRules" -}}
{{- if ne .Values.helmDriver "sql" }}
- apiGroups: [""]
  resources: [{{ include "helm-autorecover.recordResource" . }}]
  verbs: [get, list, watch, create, update, delete]
{{- end }}
{{- if ne .Values.lockBackend "release" }}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, delete]
{{- end }}
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list]
{{- $rollback := eq .Values.recoverStrategy "rollback" }}
{{- range .Values.rbac.recoveryRules }}
{{- $verbs := get . "verbs" }}
{{- if $rollback }}
{{- $verbs = append $verbs "create" | uniq }}
{{- end }}
- apiGroups: {{ get . "apiGroups" | toJson }}
  resources: {{ get . "resources" | toJson }}
  {{- with get . "resourceNames" }}
  resourceNames: {{ toJson . }}
  {{- end }}
  verbs: {{ toJson $verbs }}
{{- end }}
{{- if .Values.recoverDeleteData }}
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [delete]
{{- end }}
{{- end -}}

{{/*
Cluster-scoped rights: reading Namespaces (the helm-autorecover.io/ignore
opt-out annotation) and, for lockBackend=auto, asking the API server what
the controller may do (SelfSubjectAccessReviews). Namespaces are
cluster-scoped objects, so even with namespaces listed these need a
ClusterRole.
*/}}
{{- define "helm-autorecover.clusterRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- if eq .Values.lockBackend "auto" }}
- apiGroups: [authorization.k8s.io]
  resources: [selfsubjectaccessreviews]
  verbs: [create]
{{- end }}
{{- end -}}

{{/* The subject RBAC bindings name: the controller's ServiceAccount. */}}
{{- define "helm-autorecover.subjects" -}}
- kind: ServiceAccount
  name: {{ include "helm-autorecover.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* Checks of values the schema cannot express; fails the render. */}}
{{- define "helm-autorecover.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled=true: without it every replica would recover the same releases" -}}
{{- end -}}
{{- if eq (int .Values.metrics.port) (int .Values.health.port) -}}
{{- fail "metrics.port and health.port must differ" -}}
{{- end -}}
{{- if ne (len .Values.namespaces) (len (uniq .Values.namespaces)) -}}
{{- fail "namespaces lists a namespace twice" -}}
{{- end -}}
{{- end -}}

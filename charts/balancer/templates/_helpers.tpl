{{/*
Names are fixed, not derived from the release name: the CRD, the webhook configurations and
the cluster roles are cluster-wide, so one balancer runs per cluster, and the names stay those
of deploy/ (the operator's docs and alerts name them).
*/}}

{{/* Every object's labels: Helm's standard ones and deploy/'s part-of. */}}
{{- define "balancer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: balancer
{{- end }}

{{/* The operator's pods, as selected by its Deployment, Service, PDB and NetworkPolicy. */}}
{{- define "balancer.selectorLabels" -}}
app.kubernetes.io/name: balancer
{{- end }}

{{- define "balancer.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Certificate cert-manager injects the CA from. */}}
{{- define "balancer.injectCAFrom" -}}
{{ .Release.Namespace }}/balancer-serving-cert
{{- end }}

{{/* A webhook clientConfig's service, in the release namespace, and the supplied CA. */}}
{{- define "balancer.webhookClientConfig" -}}
{{- with .root.Values.certificates.caBundle }}
caBundle: {{ . }}
{{- end }}
service:
  name: balancer-webhook
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: 443
{{- end }}

{{/* The sha256 of the Gateway API CRDs in gateway-api/ (their names and contents). */}}
{{- define "balancer.gatewayAPICRDsChecksum" -}}
{{- $all := "" }}
{{- range $path, $_ := .Files.Glob "gateway-api/*.yaml" }}
{{- $all = print $all $path "\n" ($.Files.Get $path) }}
{{- end }}
{{- sha256sum $all }}
{{- end }}

{{/* Refuses combinations the schema cannot express. */}}
{{- define "balancer.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicas > 1 needs leaderElection.enabled: replicas would reconcile the same Balancers at once" }}
{{- end }}
{{- if and .Values.certificates.certManager .Values.certificates.caBundle }}
{{- fail "certificates.caBundle is for certificates.certManager: false; cert-manager injects its own CA" }}
{{- end }}
{{- end }}

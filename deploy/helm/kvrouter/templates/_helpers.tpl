{{- define "kvrouter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvrouter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: kvrouter
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* selector labels of one component: router, gateway or engine */}}
{{- define "kvrouter.selector" -}}
app.kubernetes.io/name: kvrouter
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvrouter.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The NATS URLs every kvrouter process connects to. */}}
{{- define "kvrouter.natsURL" -}}
{{- if .Values.nats.enabled -}}
{{- $name := "nats" -}}
{{- if contains $name .Release.Name -}}
{{- printf "nats://%s:4222" (.Release.Name | trunc 63 | trimSuffix "-") -}}
{{- else -}}
{{- printf "nats://%s-%s:4222" .Release.Name $name | trunc 70 -}}
{{- end -}}
{{- else -}}
{{- required "existingNats.url is required when nats.enabled is false" .Values.existingNats.url -}}
{{- end -}}
{{- end -}}

{{/* --stream-replicas: the value, else min(NATS cluster size, 3). */}}
{{- define "kvrouter.streamReplicas" -}}
{{- if .Values.router.streamReplicas -}}
{{- .Values.router.streamReplicas -}}
{{- else -}}
{{- $size := 1 -}}
{{- if .Values.nats.enabled -}}
{{- if .Values.nats.config.cluster.enabled -}}{{- $size = int .Values.nats.config.cluster.replicas -}}{{- end -}}
{{- else -}}
{{- $size = int .Values.existingNats.clusterSize -}}
{{- end -}}
{{- min $size 3 -}}
{{- end -}}
{{- end -}}

{{- define "kvrouter.engineModel" -}}
{{- .Values.engine.model | default (first .Values.models) -}}
{{- end -}}

{{- define "kvrouter.engineBlockSize" -}}
{{- .Values.engine.blockSize | default .Values.blockSize -}}
{{- end -}}

{{/*
kvrouter.subjectToken escapes a name into one NATS subject token as
internal/escape's SubjectToken does: printable ASCII is kept except '.', '*',
'>' and '%', which become %XX; the check test compares it with
deploy/nats/workerenv. Other bytes (spaces, non-ASCII) are refused.
*/}}
{{- define "kvrouter.subjectToken" -}}
{{- if eq . "" -}}%{{- else -}}
{{- if not (regexMatch "^[!-~]+$" .) -}}
{{- fail (printf "name %q: the chart escapes printable ASCII only; use deploy/nats/workerenv and your own NATS config" .) -}}
{{- end -}}
{{- . | replace "%" "%25" | replace "." "%2E" | replace "*" "%2A" | replace ">" "%3E" -}}
{{- end -}}
{{- end -}}

{{/* kvrouter.workerKey: internal/escape's WorkerKey for a pod name ([a-z0-9.-]). */}}
{{- define "kvrouter.workerKey" -}}
{{- . | replace "." "=2E" -}}
{{- end -}}

{{/* A string in NATS configuration syntax. */}}
{{- define "kvrouter.confString" -}}
"{{ . | replace "\\" "\\\\" | replace "\"" "\\\"" }}"
{{- end -}}

{{/* The worker ids: the engine StatefulSet's pod names. */}}
{{- define "kvrouter.engineName" -}}
{{ include "kvrouter.fullname" . }}-engine
{{- end -}}

{{/*
kvrouter.password: the password of a role's Secret: the value given, else the
one already in the cluster (upgrades keep it), else a new random one.
*/}}
{{- define "kvrouter.password" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- if .value -}}
{{- .value -}}
{{- else if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- index $existing.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum 32 -}}
{{- end -}}
{{- end -}}

{{/* The NATS flags of one role (router, gateway, worker). */}}
{{- define "kvrouter.natsArgs" -}}
- --nats-url={{ include "kvrouter.natsURL" .root }}
- --nats-inbox-prefix=_INBOX_{{ .role }}
{{- if .root.Values.natsAuth.enabled }}
- --nats-user={{ .user }}
- --nats-password-file=/etc/kvrouter/nats-auth/{{ .passwordKey | default "password" }}
{{- end }}
{{- if .root.Values.tls.enabled }}
- --nats-tls-ca=/etc/kvrouter/nats-tls/ca.crt
{{- if .root.Values.tls.mutual }}
- --nats-tls-cert=/etc/kvrouter/nats-tls/tls.crt
- --nats-tls-key=/etc/kvrouter/nats-tls/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Volume mounts and volumes for a role's NATS credentials and TLS. */}}
{{- define "kvrouter.natsMounts" -}}
{{- if .Values.natsAuth.enabled }}
- name: nats-auth
  mountPath: /etc/kvrouter/nats-auth
  readOnly: true
{{- end }}
{{- if .Values.tls.enabled }}
- name: nats-tls
  mountPath: /etc/kvrouter/nats-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "kvrouter.natsVolumes" -}}
{{- if .root.Values.natsAuth.enabled }}
- name: nats-auth
  secret:
    secretName: {{ .secret }}
    {{- with .items }}
    items:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end }}
{{- if .root.Values.tls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ required "tls.secretName is required with tls.enabled" .root.Values.tls.secretName }}
{{- end }}
{{- end -}}

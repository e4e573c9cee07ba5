{{/* Names, labels, the image, and the checks every render runs. */}}

{{- define "conduit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "conduit.fullname" -}}
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

{{- define "conduit.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "api"). */}}
{{- define "conduit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "conduit.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component: call with (dict "ctx" $ "component" "api"). */}}
{{- define "conduit.labels" -}}
helm.sh/chart: {{ include "conduit.chart" .ctx }}
{{ include "conduit.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{- define "conduit.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "conduit.redisName" -}}
{{- printf "%s-redis" (include "conduit.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "conduit.claimName" -}}
{{- default (printf "%s-home" (include "conduit.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/* Secret and key holding CONDUIT_API_KEYS, as a secretKeyRef body. */}}
{{- define "conduit.apiKeysRef" -}}
{{- if .Values.auth.existingSecret -}}
name: {{ .Values.auth.existingSecret }}
key: {{ .Values.auth.existingSecretKey }}
{{- else -}}
name: {{ include "conduit.fullname" . }}
key: CONDUIT_API_KEYS
{{- end }}
{{- end }}

{{/* Secret and key holding CONDUIT_METRICS_KEY, as a secretKeyRef body. */}}
{{- define "conduit.metricsKeyRef" -}}
{{- if .Values.metrics.existingSecret -}}
name: {{ .Values.metrics.existingSecret }}
key: {{ .Values.metrics.existingSecretKey }}
{{- else -}}
name: {{ include "conduit.fullname" . }}
key: CONDUIT_METRICS_KEY
{{- end }}
{{- end }}

{{/* The Celery queues the workers consume (worker/celery_app.py: ANSWER_QUEUE, INGEST_QUEUE;
     a test holds them equal), one per line. KEDA scales on their lengths. */}}
{{- define "conduit.queues" -}}
conduit.answer
conduit.ingest
{{- end }}

{{/* A component's topologySpreadConstraints, each given the component's labelSelector:
     call with (dict "ctx" $ "component" "api"). */}}
{{- define "conduit.topologySpread" -}}
{{- $out := list }}
{{- range (index .ctx.Values .component).topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "conduit.selectorLabels" (dict "ctx" $.ctx "component" $.component) | fromYaml)) }}
{{- end }}
{{- $out = append $out $c }}
{{- end }}
{{- if $out }}
{{- toYaml $out }}
{{- end }}
{{- end }}

{{/* Secret and key holding CONDUIT_REDIS_URL, as a secretKeyRef body. */}}
{{- define "conduit.redisUrlRef" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.existingSecret -}}
name: {{ .Values.externalRedis.existingSecret }}
key: {{ .Values.externalRedis.existingSecretKey }}
{{- else -}}
name: {{ include "conduit.fullname" . }}
key: CONDUIT_REDIS_URL
{{- end }}
{{- end }}

{{/* A config value as an env string: integral numbers without an exponent (YAML and JSON
     numbers reach templates as float64, and 21474836480 would print as 2.147483648e+10). */}}
{{- define "conduit.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- int64 . | toString -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end }}

{{/* CONDUIT_DEVICE of a component: call with the component's values. */}}
{{- define "conduit.device" -}}
{{- if .device }}{{ .device }}{{ else if gt (int .gpu) 0 }}cuda{{ else }}cpu{{ end }}
{{- end }}

{{/* Checksum of everything the pods read from the ConfigMap and the chart's Secret inputs. */}}
{{- define "conduit.configChecksum" -}}
{{- toJson (dict "config" .Values.config "auth" .Values.auth "externalRedis" .Values.externalRedis "redis" .Values.redis.auth "metrics" (pick .Values.metrics "key" "existingSecret" "existingSecretKey" "workerPort")) | sha256sum }}
{{- end }}

{{/* Values combinations the chart refuses, with the reason. */}}
{{- define "conduit.validate" -}}
{{- $ext := or .Values.externalRedis.url .Values.externalRedis.existingSecret }}
{{- if and .Values.redis.enabled $ext }}
{{- fail "set either redis.enabled (the bundled Redis) or externalRedis, not both" }}
{{- end }}
{{- if not (or .Values.redis.enabled $ext) }}
{{- fail "the distributed form needs Redis: set redis.enabled=true or externalRedis.url / externalRedis.existingSecret" }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- $policy := .Values.redis.maxmemoryPolicy }}
{{- if not (or (hasPrefix "volatile-" $policy) (eq $policy "noeviction")) }}
{{- fail (printf "redis.maxmemoryPolicy=%s could evict metadata (collections, documents, jobs share this Redis and have no TTL): use volatile-lru with config.redis_kv_ttl_s, or noeviction" $policy) }}
{{- end }}
{{- if and (hasPrefix "volatile-" $policy) (not .Values.config.redis_kv_ttl_s) }}
{{- fail (printf "redis.maxmemoryPolicy=%s evicts only keys with a TTL: set config.redis_kv_ttl_s so page KV can be evicted" $policy) }}
{{- end }}
{{- if not (regexMatch "^[A-Za-z0-9._~-]*$" (toString .Values.redis.auth.password)) }}
{{- fail "redis.auth.password may hold only letters, digits and ._~- (it is embedded in the Redis URL)" }}
{{- end }}
{{- end }}
{{- if not (or .Values.auth.apiKeys .Values.auth.existingSecret .Values.auth.generate) }}
{{- fail "the API listens on the pod network and needs keys: set auth.apiKeys or auth.existingSecret, or auth.generate=true" }}
{{- end }}
{{- $keda := .Values.worker.autoscaling.keda }}
{{- if and $keda.enabled (not .Values.redis.enabled) (not $keda.address) }}
{{- fail "worker.autoscaling.keda with externalRedis needs worker.autoscaling.keda.address (host:port) and, for a password, keda.passwordSecret" }}
{{- end }}
{{- if and $keda.enabled (gt (int $keda.minReplicas) (int $keda.maxReplicas)) }}
{{- fail "worker.autoscaling.keda.minReplicas is above maxReplicas" }}
{{- end }}
{{- if and .Values.api.autoscaling.enabled (gt (int .Values.api.autoscaling.minReplicas) (int .Values.api.autoscaling.maxReplicas)) }}
{{- fail "api.autoscaling.minReplicas is above maxReplicas" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.enabled needs ingress.hosts" }}
{{- end }}
{{- if and .Values.gateway.enabled (not .Values.gateway.parentRefs) }}
{{- fail "gateway.enabled needs gateway.parentRefs (the Gateway to attach to)" }}
{{- end }}
{{- if and (gt (int .Values.worker.gpu) 0) (eq (include "conduit.device" .Values.worker) "cpu") }}
{{- fail "worker.gpu > 0 with worker.device=cpu wastes the GPU: leave worker.device empty or set cuda" }}
{{- end }}
{{- end }}

{{/* Environment of an api or worker container besides the ConfigMap (envFrom): call with
     (dict "ctx" $ "component" "api"). Only the api gets the API keys. */}}
{{- define "conduit.env" -}}
{{- $values := .ctx.Values }}
{{- $component := index $values .component }}
- name: CONDUIT_DEVICE
  value: {{ include "conduit.device" $component | quote }}
- name: CONDUIT_HOME
  value: {{ $values.persistence.mountPath | quote }}
- name: CONDUIT_REDIS_URL
  valueFrom:
    secretKeyRef:
      {{- include "conduit.redisUrlRef" .ctx | nindent 6 }}
{{- if eq .component "api" }}
- name: CONDUIT_API_KEYS
  valueFrom:
    secretKeyRef:
      {{- include "conduit.apiKeysRef" .ctx | nindent 6 }}
- name: CONDUIT_METRICS_KEY
  valueFrom:
    secretKeyRef:
      {{- include "conduit.metricsKeyRef" .ctx | nindent 6 }}
{{- else if gt (int $values.metrics.workerPort) 0 }}
- name: CONDUIT_WORKER_METRICS_PORT
  value: {{ $values.metrics.workerPort | int | toString | quote }}
{{- end }}
- name: HF_HOME
  value: {{ printf "%s/huggingface" $values.persistence.mountPath | quote }}
- name: HOME
  value: /tmp
{{- with $values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes of api and worker pods. */}}
{{- define "conduit.volumes" -}}
- name: home
  persistentVolumeClaim:
    claimName: {{ include "conduit.claimName" . }}
- name: tmp
  emptyDir: {}
{{- end }}

{{- define "conduit.volumeMounts" -}}
- name: home
  mountPath: {{ .Values.persistence.mountPath }}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* nvidia.com/gpu as a limit (Kubernetes takes extended resources as limits) merged into the
     component's resources: call with the component's values. */}}
{{- define "conduit.resources" -}}
{{- $res := deepCopy (default (dict) .resources) }}
{{- if gt (int .gpu) 0 }}
{{- $limits := default (dict) $res.limits }}
{{- $_ := set $limits "nvidia.com/gpu" (int .gpu) }}
{{- $_ := set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end }}

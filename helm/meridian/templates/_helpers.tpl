{{/* ---------- names and labels ---------- */}}

{{- define "meridian.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meridian.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "meridian.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "meridian.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meridian
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: call with (dict "root" $ "component" "proxy"). */}}
{{- define "meridian.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meridian.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "meridian.proxy.fullname" -}}
{{- printf "%s-proxy" (include "meridian.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meridian.proxy.serviceAccountName" -}}
{{- if .Values.proxy.serviceAccount.create -}}
{{- default (include "meridian.proxy.fullname" .) .Values.proxy.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.proxy.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The proxy's image. The release image has no engine twin, so demo mode (simulated
answers) defaults to the build with it, tagged `<appVersion>-twin`. */}}
{{- define "meridian.proxy.image" -}}
{{- $tag := .Values.proxy.image.tag -}}
{{- if not $tag -}}
{{- $tag = ternary (printf "%s-twin" .Chart.AppVersion) .Chart.AppVersion (eq .Values.demo true) -}}
{{- end -}}
{{- printf "%s:%s" .Values.proxy.image.repository $tag -}}
{{- end -}}

{{- define "meridian.vllm.image" -}}
{{- printf "%s:%s" .Values.vllm.image.repository (default .Chart.AppVersion .Values.vllm.image.tag) -}}
{{- end -}}

{{/* Name of one vLLM engine (Deployment and Service): (dict "root" $ "model" $m "index" $i). */}}
{{- define "meridian.vllm.engineName" -}}
{{- printf "%s-vllm-%s-%d" (include "meridian.fullname" .root) .model.name (int .index) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* ---------- the hook channel ---------- */}}

{{/* "true" when the chart runs engines with the hook switched on. */}}
{{- define "meridian.vllm.hookOn" -}}
{{- if and .Values.vllm.hook.enabled .Values.vllm.models -}}true{{- end -}}
{{- end -}}

{{/* "true" when any upstream (the chart's or an external one) has a hook channel. */}}
{{- define "meridian.hookChannel" -}}
{{- $on := include "meridian.vllm.hookOn" . -}}
{{- range .Values.externalUpstreams -}}
{{- if .hook -}}{{- $on = "true" -}}{{- end -}}
{{- end -}}
{{- $on -}}
{{- end -}}

{{- define "meridian.hookToken.secretName" -}}
{{- default (printf "%s-hook-token" (include "meridian.fullname" .)) .Values.hookToken.existingSecret -}}
{{- end -}}

{{- define "meridian.hookToken.key" -}}
{{- if .Values.hookToken.existingSecret -}}{{ .Values.hookToken.existingSecretKey }}{{- else -}}token{{- end -}}
{{- end -}}

{{- define "meridian.hookToken.env" -}}
{{- default "MERIDIAN_HOOK_TOKEN" (dig "hook" "token_env" "" .Values.config) -}}
{{- end -}}

{{/* The env entry both sides read the channel token from. */}}
{{- define "meridian.hookToken.envVar" -}}
- name: {{ include "meridian.hookToken.env" . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "meridian.hookToken.secretName" . }}
      key: {{ include "meridian.hookToken.key" . }}
{{- end -}}

{{/* ---------- meridian.toml ---------- */}}

{{/*
The upstream endpoints: every replica of every model the chart runs (with its hook
address when the hook is on), then externalUpstreams. Rendered as a YAML list.
*/}}
{{- define "meridian.endpoints" -}}
{{- $root := . -}}
{{- $eps := list -}}
{{- range $m := .Values.vllm.models -}}
{{- range $i := until (int (default 1 $m.replicas)) -}}
{{- $name := include "meridian.vllm.engineName" (dict "root" $root "model" $m "index" $i) -}}
{{- $ep := dict "url" (printf "http://%s:%d" $name (int $root.Values.vllm.port)) "name" (printf "%s-%d" $m.name $i) -}}
{{- if $root.Values.vllm.hook.enabled -}}
{{- $_ := set $ep "hook" (printf "%s:%d" $name (int $root.Values.vllm.hook.port)) -}}
{{- end -}}
{{- with $m.role -}}
{{- $_ := set $ep "role" . -}}
{{- end -}}
{{- $eps = append $eps $ep -}}
{{- end -}}
{{- end -}}
{{- range .Values.externalUpstreams -}}
{{- $eps = append $eps (omit . "") -}}
{{- end -}}
{{- toYaml $eps -}}
{{- end -}}

{{/* The proxy's config tree: values' config plus what the chart owns. */}}
{{- define "meridian.proxyConfig" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $server := default (dict) $cfg.server -}}
{{- $_ := set $server "listen" (printf "0.0.0.0:%d" (int .Values.proxy.port)) -}}
{{- $_ := set $cfg "server" $server -}}
{{- $upstream := default (dict) $cfg.upstream -}}
{{- $eps := include "meridian.endpoints" . | fromYamlArray -}}
{{- if $eps -}}
{{- $_ := set $upstream "endpoints" $eps -}}
{{- end -}}
{{- $_ := set $cfg "upstream" $upstream -}}
{{- if and .Values.demo (not $eps) -}}
{{- $twin := default (dict) $cfg.twin -}}
{{- $_ := set $twin "enabled" true -}}
{{- $_ := set $cfg "twin" $twin -}}
{{- end -}}
{{- /* The proxy does not listen for the hook; its copy keeps the default address. */ -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The hook's config tree: [hook] and [exit] only, hook.listen owned by the chart. */}}
{{- define "meridian.hookConfig" -}}
{{- $hook := deepCopy (default (dict) .Values.config.hook) -}}
{{- $_ := set $hook "listen" (printf "0.0.0.0:%d" (int .Values.vllm.hook.port)) -}}
{{- $cfg := dict "hook" $hook -}}
{{- with .Values.config.exit -}}
{{- $_ := set $cfg "exit" (deepCopy .) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* A TOML key: bare when it can be, else a quoted string. */}}
{{- define "meridian.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{/* A TOML value: strings, numbers, booleans and arrays of them print as JSON, which is
valid TOML for them (integral numbers print as integers; TOML float fields accept those). */}}
{{- define "meridian.toml.value" -}}
{{- toJson . -}}
{{- end -}}

{{/*
One TOML table and everything under it: (dict "path" "a.b" "table" $map). Scalars first,
then sub-tables, then arrays of tables (whose elements hold scalars only). Nulls are
skipped (the proxy's default applies); a table with no scalars gets no header of its own.
*/}}
{{- define "meridian.toml.table" -}}
{{- $path := .path -}}
{{- $scalars := list -}}
{{- $tables := list -}}
{{- $arrays := list -}}
{{- range $k, $v := .table -}}
{{- if kindIs "map" $v -}}
{{- $tables = append $tables $k -}}
{{- else if and (kindIs "slice" $v) $v (kindIs "map" (first $v)) -}}
{{- $arrays = append $arrays $k -}}
{{- else if not (kindIs "invalid" $v) -}}
{{- $scalars = append $scalars $k -}}
{{- end -}}
{{- end -}}
{{- if and $path $scalars }}

[{{ $path }}]
{{- end -}}
{{- range $k := $scalars }}
{{ include "meridian.toml.key" $k }} = {{ include "meridian.toml.value" (get $.table $k) }}
{{- end -}}
{{- range $k := $tables -}}
{{- $sub := ternary (include "meridian.toml.key" $k) (printf "%s.%s" $path (include "meridian.toml.key" $k)) (eq $path "") -}}
{{- include "meridian.toml.table" (dict "path" $sub "table" (get $.table $k)) -}}
{{- end -}}
{{- range $k := $arrays -}}
{{- $sub := ternary (include "meridian.toml.key" $k) (printf "%s.%s" $path (include "meridian.toml.key" $k)) (eq $path "") -}}
{{- range $el := get $.table $k }}

[[{{ $sub }}]]
{{- range $ek, $ev := $el -}}
{{- if or (kindIs "map" $ev) (and (kindIs "slice" $ev) $ev (kindIs "map" (first $ev))) -}}
{{- fail (printf "config: %s[].%s: nested tables inside an array of tables are not supported" $sub $ek) -}}
{{- end -}}
{{- if not (kindIs "invalid" $ev) }}
{{ include "meridian.toml.key" $ek }} = {{ include "meridian.toml.value" $ev }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A whole file from a YAML config tree (string). */}}
{{- define "meridian.toml" -}}
# Rendered by the Meridian Helm chart from the release's values; edit the values, not this.
{{- include "meridian.toml.table" (dict "path" "" "table" (fromYaml .)) }}
{{- end -}}

{{/* An alert's runbook annotations: (dict "base" <runbookBaseUrl> "anchor" <id>). */}}
{{- define "meridian.runbook" -}}
runbook: {{ printf "docs/src/operations.md#%s" .anchor }}
{{- with .base }}
runbook_url: {{ printf "%s/operations.html#%s" (trimSuffix "/" .) $.anchor }}
{{- end }}
{{- end -}}

{{/* ---------- checks ---------- */}}

{{- define "meridian.checks" -}}
{{- /* A message that says what to set (a schema rule could only say "value must be true"). */ -}}
{{- if and (not .Values.demo) (empty .Values.vllm.models) (empty .Values.externalUpstreams) -}}
{{- fail "no engine to serve: set vllm.models (vLLM engines the chart runs, with the hook), externalUpstreams (OpenAI-compatible servers you run), or demo: true (SIMULATED answers from the proxy's engine twin, for trying the chart). The files in examples/ and ci/ show each" -}}
{{- end -}}
{{- $grace := float64 (default 30 (dig "server" "shutdown_grace_s" 30 .Values.config)) -}}
{{- $need := addf $grace .Values.proxy.preStopSleepSeconds -}}
{{- if le (float64 .Values.proxy.terminationGracePeriodSeconds) $need -}}
{{- fail (printf "proxy.terminationGracePeriodSeconds (%v) must exceed config.server.shutdown_grace_s plus proxy.preStopSleepSeconds (%v), or open streams are killed mid-way on every rollout" .Values.proxy.terminationGracePeriodSeconds $need) -}}
{{- end -}}
{{- $names := dict -}}
{{- range .Values.vllm.models -}}
{{- if hasKey $names .name -}}
{{- fail (printf "vllm.models: name %q is used twice" .name) -}}
{{- end -}}
{{- $_ := set $names .name true -}}
{{- end -}}
{{- /* Replicas split each engine's max_streams by their count: a wrong count overfills or idles the engines. */ -}}
{{- $split := int (default 1 (dig "admission" "replicas" 1 .Values.config)) -}}
{{- if gt $split 1 -}}
{{- if .Values.proxy.autoscaling.enabled -}}
{{- fail (printf "config.admission.replicas (%d) splits each engine's limit by a fixed count, which proxy.autoscaling changes: leave it at 1 with autoscaling" $split) -}}
{{- end -}}
{{- if ne $split (int .Values.proxy.replicas) -}}
{{- fail (printf "config.admission.replicas (%d) must equal proxy.replicas (%d): each replica holds that share of every engine's max_streams" $split (int .Values.proxy.replicas)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.proxy.podDisruptionBudget.enabled (not (kindIs "invalid" .Values.proxy.podDisruptionBudget.minAvailable)) (not (kindIs "invalid" .Values.proxy.podDisruptionBudget.maxUnavailable)) -}}
{{- fail "proxy.podDisruptionBudget: set minAvailable or maxUnavailable, not both (null the other)" -}}
{{- end -}}
{{- end -}}

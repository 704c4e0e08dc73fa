{{/*
The name of every object of the release. With the release named flotilla-hub, as the
README suggests, it is flotilla-hub.
*/}}
{{- define "flotilla-hub.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "flotilla-hub.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "flotilla-hub.labels" -}}
{{ include "flotilla-hub.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The label the leading replica sets on its own Pod, and takes off every other Pod
(reconciler/leader): the Services of the tunnel, the HTTP endpoints and the leader's
API proxy select it, so that they reach the one replica that serves them.
*/}}
{{- define "flotilla-hub.leaderLabel" -}}
flotilla.dev/hub-leader: "true"
{{- end -}}

{{/* The namespace of each source on the hub: its namespace, else its tenant's name. */}}
{{- define "flotilla-hub.sourceNamespaces" -}}
{{- $out := list -}}
{{- range .Values.sources -}}
{{- $out = append $out (.namespace | default .tenant) -}}
{{- end -}}
{{- toJson (uniq $out) -}}
{{- end -}}

{{/* The API proxy's address as the hub's Kueue reaches it. */}}
{{- define "flotilla-hub.dispatchURL" -}}
{{- .Values.dispatch.url | default (printf "https://%s-proxy.%s.svc:%d" (include "flotilla-hub.fullname" .) .Release.Namespace (int .Values.dispatch.port)) -}}
{{- end -}}

{{/* The leading replica's API proxy, as the other replicas reach it to relay. */}}
{{- define "flotilla-hub.leaderProxyURL" -}}
{{- printf "https://%s-proxy-leader.%s.svc:%d" (include "flotilla-hub.fullname" .) .Release.Namespace (int .Values.dispatch.port) -}}
{{- end -}}

{{/* The Secret that holds the API proxy's CA, in the release's namespace. */}}
{{- define "flotilla-hub.caSecret" -}}
{{- .Values.dispatch.caSecret | default (printf "%s-proxy-ca" (include "flotilla-hub.fullname" .)) -}}
{{- end -}}

{{/*
The files the hub reads besides its configuration, and the configuration that names
them, worked out once so that the two always agree. The result, as YAML:

  files:   [{secret|configMap: NAME, key: KEY, path: PATH}], PATH under /etc/flotilla
  config:  the hub's config.yaml (cmd/flotilla-hub/config.go)

Every credential comes from an existing Secret, by name and key, and reaches the hub as
a file of the pod's one projected volume: nothing secret is in the ConfigMap, in the
pod's environment or in the release's values.
*/}}
{{- define "flotilla-hub.plan" -}}
{{- $root := "/etc/flotilla" -}}
{{- $files := list -}}
{{- $v := .Values -}}
{{- $cfg := dict -}}
{{- $_ := set $cfg "listen" (dict "tunnel" (printf ":%d" (int $v.tunnel.port)) "http" (printf ":%d" (int $v.http.port))) -}}
{{- with $v.tls.existingSecret -}}
{{- $files = append $files (dict "secret" . "key" "tls.crt" "path" "secrets/tls/tls.crt") -}}
{{- $files = append $files (dict "secret" . "key" "tls.key" "path" "secrets/tls/tls.key") -}}
{{- $_ := set $cfg "tls" (dict "certFile" (printf "%s/secrets/tls/tls.crt" $root) "keyFile" (printf "%s/secrets/tls/tls.key" $root)) -}}
{{- end -}}
{{- if $v.allowInsecureLoopback -}}
{{- $_ := set $cfg "allowInsecureLoopback" true -}}
{{- end -}}
{{- $publicURL := $v.publicURL -}}
{{- if and (not $publicURL) $v.ingress.enabled $v.ingress.hosts -}}
{{- $host := first $v.ingress.hosts -}}
{{- $scheme := "http" -}}
{{- range $v.ingress.tls -}}
{{- if has $host (.hosts | default list) -}}
{{- $scheme = "https" -}}
{{- end -}}
{{- end -}}
{{- $publicURL = printf "%s://%s" $scheme $host -}}
{{- end -}}
{{- with $publicURL -}}
{{- $_ := set $cfg "publicURL" . -}}
{{- end -}}
{{- $identities := list -}}
{{- if $v.age.existingSecret -}}
{{- range $v.age.keys -}}
{{- $path := printf "secrets/age/%s" . -}}
{{- $files = append $files (dict "secret" $v.age.existingSecret "key" . "path" $path) -}}
{{- $identities = append $identities (printf "%s/%s" $root $path) -}}
{{- end -}}
{{- end -}}
{{- if $identities -}}
{{- $_ := set $cfg "age" (dict "identityFiles" $identities) -}}
{{- end -}}
{{- if $v.kms -}}
{{- $_ := set $cfg "kms" true -}}
{{- end -}}
{{- $heartbeat := dict -}}
{{- with $v.heartbeat.interval }}{{ $_ := set $heartbeat "interval" . }}{{ end -}}
{{- with $v.heartbeat.timeout }}{{ $_ := set $heartbeat "timeout" . }}{{ end -}}
{{- with $heartbeat }}{{ $_ := set $cfg "heartbeat" . }}{{ end -}}
{{- $kubeAPI := dict -}}
{{- with $v.kubeAPI.qps }}{{ $_ := set $kubeAPI "qps" (float64 .) }}{{ end -}}
{{- with $v.kubeAPI.burst }}{{ $_ := set $kubeAPI "burst" (int64 .) }}{{ end -}}
{{- with $v.kubeAPI.maxInFlight }}{{ $_ := set $kubeAPI "maxInFlight" (int64 .) }}{{ end -}}
{{- with $kubeAPI }}{{ $_ := set $cfg "kubeAPI" . }}{{ end -}}
{{- if $v.dispatch.enabled -}}
{{- $d := dict "listen" (printf ":%d" (int $v.dispatch.port)) "url" (include "flotilla-hub.dispatchURL" .) "namespace" .Release.Namespace "caSecret" (include "flotilla-hub.caSecret" .) "kueueNamespace" $v.dispatch.kueueNamespace "leaderURL" (include "flotilla-hub.leaderProxyURL" .) -}}
{{- with $v.dispatch.resumeWindow }}{{ $_ := set $d "resumeWindow" . }}{{ end -}}
{{- $_ := set $cfg "dispatch" $d -}}
{{- end -}}
{{- $conns := dict -}}
{{- range $which := list "tunnel" "http" "proxy" -}}
{{- $l := dict -}}
{{- with (get ($v.connections | default dict) $which) -}}
{{- with .max }}{{ $_ := set $l "max" (int64 .) }}{{ end -}}
{{- with .idleTimeout }}{{ $_ := set $l "idleTimeout" . }}{{ end -}}
{{- end -}}
{{- with $l }}{{ $_ := set $conns $which . }}{{ end -}}
{{- end -}}
{{- with $conns }}{{ $_ := set $cfg "connections" . }}{{ end -}}
{{- with ($v.pprof | default dict).listen }}{{ $_ := set $cfg "pprof" (dict "listen" . "allowRemote" (($v.pprof).allowRemote | default false)) }}{{ end -}}
{{- $_ := set $cfg "leaderElection" (dict "enabled" true "namespace" .Release.Namespace "name" (include "flotilla-hub.fullname" .)) -}}
{{- $plans := dict -}}
{{- with $v.plans.timeout }}{{ $_ := set $plans "timeout" . }}{{ end -}}
{{- with $v.plans.workers }}{{ $_ := set $plans "workers" (int64 .) }}{{ end -}}
{{- with $v.plans.maxRenderedClusters }}{{ $_ := set $plans "maxRenderedClusters" (int64 .) }}{{ end -}}
{{- with $plans }}{{ $_ := set $cfg "plans" . }}{{ end -}}
{{- $heads := dict -}}
{{- with $v.heads.maxBytes }}{{ $_ := set $heads "maxBytes" (int64 .) }}{{ end -}}
{{- with $v.heads.maxFiles }}{{ $_ := set $heads "maxFiles" (int64 .) }}{{ end -}}
{{- with $v.heads.maxDepth }}{{ $_ := set $heads "maxDepth" (int64 .) }}{{ end -}}
{{- with $v.heads.maxClusterBytes }}{{ $_ := set $heads "maxClusterBytes" (int64 .) }}{{ end -}}
{{- with $v.heads.maxClusterFiles }}{{ $_ := set $heads "maxClusterFiles" (int64 .) }}{{ end -}}
{{- $fetch := dict -}}
{{- range $which := list "branch" "pullRequest" -}}
{{- $l := dict -}}
{{- with (get $v.heads.fetch $which) -}}
{{- with .maxBytes }}{{ $_ := set $l "maxBytes" (int64 .) }}{{ end -}}
{{- with .maxObjects }}{{ $_ := set $l "maxObjects" (int64 .) }}{{ end -}}
{{- end -}}
{{- with $l }}{{ $_ := set $fetch $which . }}{{ end -}}
{{- end -}}
{{- $open := dict -}}
{{- with $v.heads.fetch.openPullRequests -}}
{{- with .max }}{{ $_ := set $open "max" (int64 .) }}{{ end -}}
{{- with .maxBytes }}{{ $_ := set $open "maxBytes" (int64 .) }}{{ end -}}
{{- end -}}
{{- with $open }}{{ $_ := set $fetch "openPullRequests" . }}{{ end -}}
{{- with $v.heads.fetch.timeout }}{{ $_ := set $fetch "timeout" . }}{{ end -}}
{{- with $fetch }}{{ $_ := set $heads "fetch" . }}{{ end -}}
{{- with $heads }}{{ $_ := set $cfg "heads" . }}{{ end -}}
{{- with ($v.statuses | default dict).summaryThreshold }}{{ $_ := set $cfg "statuses" (dict "summaryThreshold" (int64 .)) }}{{ end -}}
{{- $sources := list -}}
{{- range $v.sources -}}
{{- $dir := printf "secrets/sources/%s" .name -}}
{{- $s := dict "name" .name "url" .url "tenant" .tenant "branch" (.branch | default "main") "namespace" (.namespace | default .tenant) -}}
{{- with .poll }}{{ $_ := set $s "poll" . }}{{ end -}}
{{- with (.dispatch | default dict).workloadNamespaces }}{{ $_ := set $s "dispatch" (dict "workloadNamespaces" .) }}{{ end -}}
{{- with .webhookSecret -}}
{{- if .existingSecret -}}
{{- $files = append $files (dict "secret" .existingSecret "key" (.key | default "secret") "path" (printf "%s/webhook-secret" $dir)) -}}
{{- $_ := set $s "webhookSecretFile" (printf "%s/%s/webhook-secret" $root $dir) -}}
{{- end -}}
{{- end -}}
{{- $git := dict -}}
{{- $g := .git | default dict -}}
{{- with $g.username }}{{ $_ := set $git "username" . }}{{ end -}}
{{- with $g.password -}}
{{- if .existingSecret -}}
{{- $files = append $files (dict "secret" .existingSecret "key" (.key | default "password") "path" (printf "%s/git-password" $dir)) -}}
{{- $_ := set $git "passwordFile" (printf "%s/%s/git-password" $root $dir) -}}
{{- end -}}
{{- end -}}
{{- $sshSecret := "" -}}
{{- with $g.sshKey -}}
{{- if .existingSecret -}}
{{- $sshSecret = .existingSecret -}}
{{- $files = append $files (dict "secret" .existingSecret "key" (.key | default "identity") "path" (printf "%s/ssh-key" $dir)) -}}
{{- $_ := set $git "sshKeyFile" (printf "%s/%s/ssh-key" $root $dir) -}}
{{- end -}}
{{- end -}}
{{- if $sshSecret -}}
{{- $kh := $g.knownHosts | default dict -}}
{{- $files = append $files (dict "secret" ($kh.existingSecret | default $sshSecret) "key" ($kh.key | default "known_hosts") "path" (printf "%s/known-hosts" $dir)) -}}
{{- $_ := set $git "knownHostsFile" (printf "%s/%s/known-hosts" $root $dir) -}}
{{- end -}}
{{- with $g.trustedKeys -}}
{{- if .existingConfigMap -}}
{{- $files = append $files (dict "configMap" .existingConfigMap "key" (.key | default "trusted.asc") "path" (printf "%s/trusted-keys.asc" $dir)) -}}
{{- $_ := set $git "trustedKeysFile" (printf "%s/%s/trusted-keys.asc" $root $dir) -}}
{{- else if .existingSecret -}}
{{- $files = append $files (dict "secret" .existingSecret "key" (.key | default "trusted.asc") "path" (printf "%s/trusted-keys.asc" $dir)) -}}
{{- $_ := set $git "trustedKeysFile" (printf "%s/%s/trusted-keys.asc" $root $dir) -}}
{{- end -}}
{{- end -}}
{{- with $git }}{{ $_ := set $s "git" . }}{{ end -}}
{{- $st := .statuses | default dict -}}
{{- $statuses := dict "kind" ($st.kind | default "notes") -}}
{{- range $k := list "url" "owner" "repo" "project" -}}
{{- with get $st $k }}{{ $_ := set $statuses $k . }}{{ end -}}
{{- end -}}
{{- with $st.summaryThreshold }}{{ $_ := set $statuses "summaryThreshold" (int64 .) }}{{ end -}}
{{- with $st.token -}}
{{- if .existingSecret -}}
{{- $files = append $files (dict "secret" .existingSecret "key" (.key | default "token") "path" (printf "%s/forge-token" $dir)) -}}
{{- $_ := set $statuses "tokenFile" (printf "%s/%s/forge-token" $root $dir) -}}
{{- end -}}
{{- end -}}
{{- with $st.githubApp -}}
{{- if .appID -}}
{{- $_ := set $statuses "appID" (int64 .appID) -}}
{{- $_ := set $statuses "installationID" (int64 (.installationID | default 0)) -}}
{{- with .privateKey -}}
{{- if .existingSecret -}}
{{- $files = append $files (dict "secret" .existingSecret "key" (.key | default "private-key.pem") "path" (printf "%s/github-app-key.pem" $dir)) -}}
{{- $_ := set $statuses "privateKeyFile" (printf "%s/%s/github-app-key.pem" $root $dir) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $_ := set $s "statuses" $statuses -}}
{{- $sources = append $sources $s -}}
{{- end -}}
{{- $_ := set $cfg "sources" $sources -}}
{{- toYaml (dict "files" $files "config" $cfg) -}}
{{- end -}}

{{/*
Combinations of values that install a hub that cannot work, refused before anything is
created, each with what to do instead. values.schema.json checks each value alone;
these check them together. The hub checks its configuration again when it starts
(cmd/flotilla-hub/config.go): these catch at install time what would otherwise be a
crash-looping pod.
*/}}
{{- define "flotilla-hub.checks" -}}
{{- $v := .Values -}}
{{- if not $v.sources -}}
{{- fail "sources: no fleet repository to follow; add at least one source with its name, url and tenant" -}}
{{- end -}}
{{- if and (not $v.tls.existingSecret) (not $v.allowInsecureLoopback) -}}
{{- fail "tls.existingSecret: the tunnel needs a certificate; name a kubernetes.io/tls Secret (tls.crt, tls.key) for the hub's address, or set allowInsecureLoopback for a TLS-terminating proxy inside the pod" -}}
{{- end -}}
{{- if and (not $v.age.existingSecret) (not $v.kms) -}}
{{- fail "age.existingSecret: the hub needs its age identity to read the enrollment tokens; name the Secret that holds it (or set kms for a cloud KMS)" -}}
{{- end -}}
{{- if and $v.age.existingSecret (not $v.age.keys) -}}
{{- fail (printf "age.keys: name the keys of Secret %s that hold the hub's age identities" $v.age.existingSecret) -}}
{{- end -}}
{{- if and $v.ingress.enabled (not $v.ingress.hosts) -}}
{{- fail "ingress.hosts: an Ingress for the webhooks and plans needs the host names forges and browsers reach the hub at" -}}
{{- end -}}
{{- $names := dict -}}
{{- $namespaces := dict -}}
{{- $tenants := dict -}}
{{- $claimed := dict -}}
{{- range $i, $s := $v.sources -}}
{{- $where := printf "sources[%d] (%s)" $i $s.name -}}
{{- if hasKey $names $s.name -}}
{{- fail (printf "%s: the name %s is used twice; each source needs its own (it names its webhook, /webhooks/%s)" $where $s.name $s.name) -}}
{{- end -}}
{{- $_ := set $names $s.name true -}}
{{- $ns := $s.namespace | default $s.tenant -}}
{{- if hasKey $namespaces $ns -}}
{{- fail (printf "%s: namespace %s is written by another source; give each source a namespace of its own" $where $ns) -}}
{{- end -}}
{{- $_ := set $namespaces $ns true -}}
{{- if hasKey $tenants $s.tenant -}}
{{- fail (printf "%s: sources %s and %s both follow tenant %s; give each tenant one source (two would prune each other's dispatch objects)" $where (get $tenants $s.tenant) $s.name $s.tenant) -}}
{{- end -}}
{{- $_ := set $tenants $s.tenant $s.name -}}
{{- range (($s.dispatch | default dict).workloadNamespaces | default list) -}}
{{- if hasKey $claimed . -}}
{{- fail (printf "%s: sources %s and %s both claim hub namespace %s in dispatch.workloadNamespaces; a namespace is one tenant's" $where (get $claimed .) $s.name .) -}}
{{- end -}}
{{- $_ := set $claimed . $s.name -}}
{{- end -}}
{{- $g := $s.git | default dict -}}
{{- $password := (($g.password | default dict).existingSecret) -}}
{{- $sshKey := (($g.sshKey | default dict).existingSecret) -}}
{{- $ssh := or (hasPrefix "ssh://" $s.url) (regexMatch "^[^/:@]+@[^/:]+:" $s.url) -}}
{{- if and $ssh (not $sshKey) -}}
{{- fail (printf "%s: %s is an SSH URL; name the Secret holding its private key in git.sshKey.existingSecret (with known_hosts beside it, or in git.knownHosts)" $where $s.url) -}}
{{- end -}}
{{- if and $sshKey (not $ssh) -}}
{{- fail (printf "%s: git.sshKey is set but %s is not an SSH URL (ssh://... or git@host:path)" $where $s.url) -}}
{{- end -}}
{{- if and $password $sshKey -}}
{{- fail (printf "%s: git.password and git.sshKey exclude each other; give one" $where) -}}
{{- end -}}
{{- if regexMatch "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@]*:[^/@]*@" $s.url -}}
{{- fail (printf "%s: the url carries credentials; put the password in a Secret and name it in git.password" $where) -}}
{{- end -}}
{{- $st := $s.statuses | default dict -}}
{{- $kind := $st.kind | default "notes" -}}
{{- $token := (($st.token | default dict).existingSecret) -}}
{{- $app := $st.githubApp | default dict -}}
{{- if and (has $kind (list "github" "gitea" "gitlab")) (not $token) (not (and (eq $kind "github") $app.appID)) -}}
{{- if eq $kind "github" -}}
{{- fail (printf "%s: statuses.kind github needs a token Secret in statuses.token.existingSecret, or a GitHub App (statuses.githubApp with its privateKey Secret)" $where) -}}
{{- else -}}
{{- fail (printf "%s: statuses.kind %s needs the Secret holding its API token in statuses.token.existingSecret" $where $kind) -}}
{{- end -}}
{{- end -}}
{{- if $app.appID -}}
{{- if ne $kind "github" -}}
{{- fail (printf "%s: statuses.githubApp is for statuses.kind github, not %s" $where $kind) -}}
{{- end -}}
{{- if $token -}}
{{- fail (printf "%s: statuses.token and statuses.githubApp exclude each other; give one" $where) -}}
{{- end -}}
{{- if not $app.installationID -}}
{{- fail (printf "%s: statuses.githubApp.installationID is required with appID" $where) -}}
{{- end -}}
{{- if not (($app.privateKey | default dict).existingSecret) -}}
{{- fail (printf "%s: statuses.githubApp needs the Secret holding the app's private key in statuses.githubApp.privateKey.existingSecret" $where) -}}
{{- end -}}
{{- end -}}
{{- if and (has $kind (list "github" "gitea")) (or (not $st.owner) (not $st.repo)) -}}
{{- fail (printf "%s: statuses.kind %s needs statuses.owner and statuses.repo" $where $kind) -}}
{{- end -}}
{{- if and (has $kind (list "gitea" "gitlab")) (not $st.url) -}}
{{- fail (printf "%s: statuses.kind %s needs the forge's base URL in statuses.url" $where $kind) -}}
{{- end -}}
{{- if and (eq $kind "gitlab") (not $st.project) -}}
{{- fail (printf "%s: statuses.kind gitlab needs statuses.project (group/name or its ID)" $where) -}}
{{- end -}}
{{- if and $token (not (has $kind (list "github" "gitea" "gitlab"))) -}}
{{- fail (printf "%s: statuses.token is set but statuses.kind is %s, which posts to no forge" $where $kind) -}}
{{- end -}}
{{- end -}}
{{- end -}}

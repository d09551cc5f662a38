{{/*
Chart name, truncated to 63 characters (the DNS label limit of Kubernetes names).
*/}}
{{- define "token-broker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: release-chart, or the release name alone when it already contains the chart name.
Truncated to 63 characters because some Kubernetes name fields are limited to that.
*/}}
{{- define "token-broker.fullname" -}}
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

{{/*
name-version for the helm.sh/chart label.
*/}}
{{- define "token-broker.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "token-broker.labels" -}}
helm.sh/chart: {{ include "token-broker.chart" . }}
{{ include "token-broker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: token-broker
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels: stable for the life of a release (a Deployment's selector is immutable).
*/}}
{{- define "token-broker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "token-broker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /*
The ServiceAccount the `helm test` pod runs as: tests.tokenFetch.serviceAccountName, else one of
its own (templates/tests/test-serviceaccount.yaml).
*/ -}}
{{- define "token-broker.testServiceAccountName" -}}
{{- (.Values.tests.tokenFetch | default dict).serviceAccountName | default (printf "%s-test" (include "token-broker.fullname" . | trunc 58 | trimSuffix "-")) }}
{{- end }}

{{- define "token-broker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "token-broker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the existing ServiceAccount" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
image reference: repository@digest when a digest is given, else repository:tag.
*/}}
{{- define "token-broker.image" -}}
{{- $repo := required "image.repository is required: the registry and repository your CI pushed the broker image to" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Replicas that can run at the same time, at least: decides the PDB and whether Redis is needed.
*/}}
{{- define "token-broker.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ .Values.autoscaling.minReplicas | int }}{{ else }}{{ .Values.replicaCount | int }}{{ end }}
{{- end }}

{{- define "token-broker.maxReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ .Values.autoscaling.maxReplicas | int }}{{ else }}{{ .Values.replicaCount | int }}{{ end }}
{{- end }}

{{- define "token-broker.redisConfigured" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret.name (ne (.Values.redis.mode | default "standalone") "standalone") }}true{{ end }}
{{- end }}

{{/*
Where the chart mounts Redis passwords and TLS files it takes from Kubernetes objects.
*/}}
{{- define "token-broker.redisDir" -}}/etc/token-broker-redis{{- end }}

{{/*
A password reference for broker.yaml ({secretId} or {file}), or nothing. Called with
(dict "p" <password values> "dir" <mount dir>).
*/}}
{{- define "token-broker.redisPasswordRef" -}}
{{- if .p.secretId }}{{ toYaml (dict "secretId" .p.secretId) }}
{{- else if .p.file }}{{ toYaml (dict "file" .p.file) }}
{{- else if .p.existingSecret.name }}{{ toYaml (dict "file" (printf "%s/%s" .dir (.p.existingSecret.key | default "password"))) }}
{{- end }}
{{- end }}

{{/*
The redis section of broker.yaml that the chart models: topology, user, password references and
TLS file paths (never a URL: that comes from REDIS_URL, it may carry a password).
*/}}
{{- define "token-broker.redisConfig" -}}
{{- $r := .Values.redis }}
{{- $dir := include "token-broker.redisDir" . }}
{{- $out := dict "mode" ($r.mode | default "standalone") }}
{{- if eq $r.mode "sentinel" }}
{{- $s := dict "nodes" $r.sentinel.nodes "masterName" $r.sentinel.masterName }}
{{- with $r.sentinel.username }}{{ $_ := set $s "username" . }}{{ end }}
{{- with include "token-broker.redisPasswordRef" (dict "p" $r.sentinel.password "dir" (printf "%s/sentinel-password" $dir)) }}
{{- $_ := set $s "password" (fromYaml .) }}
{{- end }}
{{- $_ := set $out "sentinel" $s }}
{{- end }}
{{- if eq $r.mode "cluster" }}
{{- $_ := set $out "cluster" (dict "nodes" $r.cluster.nodes) }}
{{- end }}
{{- with $r.username }}{{ $_ := set $out "username" . }}{{ end }}
{{- with include "token-broker.redisPasswordRef" (dict "p" $r.password "dir" (printf "%s/password" $dir)) }}
{{- $_ := set $out "password" (fromYaml .) }}
{{- end }}
{{- if $r.tls.enabled }}
{{- $tls := dict "enabled" true }}
{{- with $r.tls.serverName }}{{ $_ := set $tls "serverName" . }}{{ end }}
{{- if or $r.tls.ca.secretName $r.tls.ca.configMapName }}
{{- $_ := set $tls "caFile" (printf "%s/tls-ca/%s" $dir ($r.tls.ca.key | default "ca.crt")) }}
{{- end }}
{{- if $r.tls.clientCertSecret }}
{{- $_ := set $tls "certFile" (printf "%s/tls-client/tls.crt" $dir) }}
{{- $_ := set $tls "keyFile" (printf "%s/tls-client/tls.key" $dir) }}
{{- end }}
{{- $_ := set $out "tls" $tls }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
Volumes (mode "volumes") or their mounts (mode "mounts") for the Redis files above.
*/}}
{{- define "token-broker.redisVolumes" -}}
{{- $r := .ctx.Values.redis }}
{{- $dir := include "token-broker.redisDir" .ctx }}
{{- $items := list }}
{{- if and (eq $r.mode "sentinel") $r.sentinel.password.existingSecret.name }}
{{- $items = append $items (dict "name" "redis-sentinel-password" "path" "sentinel-password" "secret" $r.sentinel.password.existingSecret.name) }}
{{- end }}
{{- if $r.password.existingSecret.name }}
{{- $items = append $items (dict "name" "redis-password" "path" "password" "secret" $r.password.existingSecret.name) }}
{{- end }}
{{- if and $r.tls.enabled $r.tls.ca.secretName }}
{{- $items = append $items (dict "name" "redis-tls-ca" "path" "tls-ca" "secret" $r.tls.ca.secretName) }}
{{- else if and $r.tls.enabled $r.tls.ca.configMapName }}
{{- $items = append $items (dict "name" "redis-tls-ca" "path" "tls-ca" "configMap" $r.tls.ca.configMapName) }}
{{- end }}
{{- if and $r.tls.enabled $r.tls.clientCertSecret }}
{{- $items = append $items (dict "name" "redis-tls-client" "path" "tls-client" "secret" $r.tls.clientCertSecret) }}
{{- end }}
{{- range $items }}
{{- if eq $.mode "mounts" }}
- name: {{ .name }}
  mountPath: {{ printf "%s/%s" $dir .path }}
  readOnly: true
{{- else if .configMap }}
- name: {{ .name }}
  configMap:
    name: {{ .configMap }}
{{- else }}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 288 # 0440: owner and group (fsGroup) read only
{{- end }}
{{- end }}
{{- end }}

{{/*
TCP ports the broker needs towards Redis: the data nodes' port, extra ports, and the ports of the
listed sentinel or cluster nodes.
*/}}
{{- define "token-broker.redisPorts" -}}
{{- $np := .Values.networkPolicy.egress.redis }}
{{- $ports := list ($np.port | int) }}
{{- range $np.extraPorts }}{{ $ports = append $ports (. | int) }}{{ end }}
{{- $nodes := list }}
{{- if eq .Values.redis.mode "sentinel" }}{{ $nodes = .Values.redis.sentinel.nodes }}{{ end }}
{{- if eq .Values.redis.mode "cluster" }}{{ $nodes = .Values.redis.cluster.nodes }}{{ end }}
{{- range $nodes }}
{{- $ports = append $ports (regexFind "[0-9]+$" . | int) }}
{{- end }}
{{- toYaml (uniq $ports) }}
{{- end }}

{{/*
A NetworkPolicy peer from an object's namespaceSelector and podSelector (either may be empty).
*/}}
{{- define "token-broker.selectorPeer" -}}
{{- $peer := dict }}
{{- with .namespaceSelector }}{{ $_ := set $peer "namespaceSelector" . }}{{ end }}
{{- with .podSelector }}{{ $_ := set $peer "podSelector" . }}{{ end }}
{{- toYaml $peer }}
{{- end }}

{{/*
The broker's OAuth issuer (OAUTH_ISSUER, http.issuer): config.http.issuer, else the Service's
cluster DNS name, so that the OAuth metadata never builds its URLs from a caller's Host header.
*/}}
{{- define "token-broker.issuer" -}}
{{- $port := .Values.service.port | int }}
{{- (.Values.config.http | default dict).issuer | default (printf "http://%s.%s.svc%s" (include "token-broker.fullname" .) .Release.Namespace (eq $port 80 | ternary "" (printf ":%d" $port))) }}
{{- end }}

{{/*
The audience of the callers' service-account tokens in mode kubernetes:
config.extra.callerAuth.kubernetes.audience, else <fullname>.<namespace>, one per release, so
that a token projected for one broker of the cluster is refused by every other.
*/}}
{{- define "token-broker.callerAudience" -}}
{{- $auth := (.Values.config.extra | default dict).callerAuth | default dict }}
{{- ($auth.kubernetes | default dict).audience | default (printf "%s.%s" (include "token-broker.fullname" .) .Release.Namespace) }}
{{- end }}

{{/*
Where the config file is mounted; BROKER_CONFIG_FILE points at it.
*/}}
{{- define "token-broker.configDir" -}}/etc/token-broker{{- end }}

{{/*
The broker's config file. Chart-managed keys (http.port, http.host, http.adminPort) come first, the modelled
sections next, config.extra last (deep merge, extra wins). The Redis URL is never part of it.
The defaults the chart chooses (http.issuer, the kubernetes audience) yield to values.
*/}}
{{- define "token-broker.config" -}}
{{- $c := .Values.config }}
{{- $http := merge (dict "port" (.Values.containerPort | int) "host" "0.0.0.0" "adminPort" (.Values.adminPort | int) "issuer" (include "token-broker.issuer" .)) (deepCopy $c.http) }}
{{- $cfg := dict "http" $http "log" (deepCopy $c.log) "clients" (deepCopy $c.clients) }}
{{- range $section := list "token" "provider" "orders" "forward" "audit" }}
{{- with (get $c $section) }}
{{- $_ := set $cfg $section (deepCopy .) }}
{{- end }}
{{- end }}
{{- if include "token-broker.redisConfigured" . }}
{{- $_ := set $cfg "redis" (merge (include "token-broker.redisConfig" . | fromYaml) (deepCopy ($c.redis | default dict))) }}
{{- else if $c.redis }}
{{- $_ := set $cfg "redis" (deepCopy $c.redis) }}
{{- end }}
{{- $cfg = mergeOverwrite $cfg (deepCopy ($c.extra | default dict)) }}
{{- $auth := $cfg.callerAuth | default dict }}
{{- if eq ($auth.mode | default "" | toString) "kubernetes" }}
{{- $k8s := $auth.kubernetes | default dict }}
{{- $_ := set $k8s "audience" (include "token-broker.callerAudience" .) }}
{{- $_ := set $auth "kubernetes" $k8s }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The Secret holding the `helm test` pod's caller API key (mode api-key). Also reached when the
value was set to null (`--set tests.tokenFetch.apiKeySecret=null`), which drops the map.
*/}}
{{- define "token-broker.testApiKeySecretName" -}}
{{- $secret := ((.Values.tests.tokenFetch | default dict).apiKeySecret | default dict) }}
{{- required "tests.tokenFetch.apiKeySecret.name is required in mode api-key: a Secret holding a caller API key granted the test client, so that helm test can fetch a token (or set tests.tokenFetch.enabled=false)" $secret.name }}
{{- end }}

{{/*
Checks that need more than one value: fail early, at install, with a message naming the setting,
rather than a pod that crash-loops. Included by the Deployment.
*/}}
{{- define "token-broker.validate" -}}
{{- $v := .Values }}
{{- if not $v.config.clients }}
{{- fail "config.clients: configure at least one client ({id, authUrl, baseUrl, credentials: {secretId} or {file}})" }}
{{- end }}
{{- /* The admin listener (issue #16). */}}
{{- if hasKey ($v.metrics | default dict) "port" }}
{{- fail "metrics.port was renamed adminPort: that port now serves /metrics, /health/* and the admin routes (/admin/*). Set adminPort instead (the probes and the ServiceMonitor use it)" }}
{{- end }}
{{- if eq (int $v.adminPort) (int $v.containerPort) }}
{{- fail "adminPort must differ from containerPort: the admin routes must not share the callers' port" }}
{{- end }}
{{- range $key := list "adminPort" "metricsPort" }}
{{- if or (hasKey ($v.config.http | default dict) $key) (hasKey (($v.config.extra | default dict).http | default dict) $key) }}
{{- fail (printf "config.http.%s: set the chart's adminPort instead (it also names the container and Service port)" $key) }}
{{- end }}
{{- end }}
{{- range $v.networkPolicy.ingress.admin.from }}
{{- if has . $v.networkPolicy.ingress.callers }}
{{- fail (printf "networkPolicy.ingress.admin.from lists a peer of networkPolicy.ingress.callers (%s): callers must never reach the admin port" (toJson .)) }}
{{- end }}
{{- end }}
{{- $csiFiles := dict }}
{{- range $v.csi.objects }}
{{- $_ := set $csiFiles (printf "%s/%s" (trimSuffix "/" $v.csi.mountPath) (.objectAlias | default .objectName)) true }}
{{- end }}
{{- range $i, $client := $v.config.clients }}
{{- $creds := $client.credentials | default dict }}
{{- if ne 1 (len (compact (list (hasKey $creds "secretId" | ternary "s" "") (hasKey $creds "file" | ternary "f" "") (hasKey $creds "privateKeyFile" | ternary "k" "")))) }}
{{- fail (printf "config.clients[%d] (%s).credentials: set exactly one of secretId (Secrets Manager name or ARN), file (a mounted file path) or privateKeyFile (with clientId and, for tls_client_auth, certificateFile)" $i ($client.id | default "?")) }}
{{- end }}
{{- if and $creds.file (hasPrefix (printf "%s/" (trimSuffix "/" $v.csi.mountPath)) $creds.file) }}
{{- if not $v.csi.enabled }}
{{- fail (printf "config.clients[%d] (%s).credentials.file is under csi.mountPath (%s) but csi.enabled is false: enable csi and list the secret in csi.objects" $i $client.id $v.csi.mountPath) }}
{{- else if not (hasKey $csiFiles $creds.file) }}
{{- fail (printf "config.clients[%d] (%s).credentials.file %s is not mounted: add a csi.objects entry with objectAlias %s" $i $client.id $creds.file (base $creds.file)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.redis.url $v.redis.existingSecret.name }}
{{- fail "redis.url and redis.existingSecret.name are both set: use one (existingSecret when the URL carries a password)" }}
{{- end }}
{{- if and $v.redis.url (regexMatch "^rediss?://[^/@]*:[^/@]+@" $v.redis.url) }}
{{- fail "redis.url carries a password: values are not secret storage. Put the URL in a Secret and set redis.existingSecret.name (and .key)" }}
{{- end }}
{{- if and $v.redis.url (not (regexMatch "^rediss?://[^\\s]+$" $v.redis.url)) }}
{{- fail "redis.url must be a redis:// or rediss:// URL (rediss:// for ElastiCache with in-transit encryption)" }}
{{- end }}
{{- if and (gt (include "token-broker.maxReplicas" . | int) 1) (not (include "token-broker.redisConfigured" .)) }}
{{- fail (printf "Redis is required for more than one replica (replicas up to %s): without redis.url, redis.existingSecret.name or redis.mode sentinel/cluster the broker uses its in-memory store, which is single replica only (each replica would fetch its own token). Set Redis, or replicaCount=1 with autoscaling.enabled=false" (include "token-broker.maxReplicas" .)) }}
{{- end }}
{{- if or (hasKey ($v.config.redis | default dict) "url") (hasKey ((($v.config.extra | default dict).redis) | default dict) "url") }}
{{- fail "config.redis.url / config.extra.redis.url: the Redis URL does not go in the ConfigMap; set redis.url or redis.existingSecret" }}
{{- end }}
{{- range $key := list "mode" "sentinel" "cluster" "username" "password" "tls" }}
{{- if or (hasKey ($v.config.redis | default dict) $key) (hasKey ((($v.config.extra | default dict).redis) | default dict) $key) }}
{{- fail (printf "config.redis.%s / config.extra.redis.%s: set redis.%s instead (the chart mounts the files it names)" $key $key $key) }}
{{- end }}
{{- end }}
{{- $r := $v.redis }}
{{- if and (ne $r.mode "standalone") (or $r.url $r.existingSecret.name) }}
{{- fail (printf "redis.url / redis.existingSecret: only in redis.mode standalone; mode %s finds its nodes from redis.%s.nodes" $r.mode $r.mode) }}
{{- end }}
{{- if and (eq $r.mode "sentinel") (not (and $r.sentinel.nodes $r.sentinel.masterName)) }}
{{- fail "redis.sentinel.nodes and redis.sentinel.masterName are required in redis.mode sentinel" }}
{{- end }}
{{- if and (eq $r.mode "cluster") (not $r.cluster.nodes) }}
{{- fail "redis.cluster.nodes is required in redis.mode cluster (seed nodes or the configuration endpoint, host:port)" }}
{{- end }}
{{- if and (ne $r.mode "sentinel") (or $r.sentinel.nodes $r.sentinel.masterName) }}
{{- fail "redis.sentinel.*: set redis.mode sentinel to use them" }}
{{- end }}
{{- if and (ne $r.mode "cluster") $r.cluster.nodes }}
{{- fail "redis.cluster.nodes: set redis.mode cluster to use them" }}
{{- end }}
{{- range $name, $p := dict "redis.password" $r.password "redis.sentinel.password" $r.sentinel.password }}
{{- $set := 0 }}
{{- if $p.secretId }}{{ $set = add1 $set }}{{ end }}
{{- if $p.file }}{{ $set = add1 $set }}{{ end }}
{{- if $p.existingSecret.name }}{{ $set = add1 $set }}{{ end }}
{{- if gt $set 1 }}
{{- fail (printf "%s: set at most one of secretId, file or existingSecret.name" $name) }}
{{- end }}
{{- end }}
{{- if and (not $r.tls.enabled) (or $r.tls.ca.secretName $r.tls.ca.configMapName $r.tls.clientCertSecret $r.tls.serverName) }}
{{- fail "redis.tls.ca / clientCertSecret / serverName have no effect without redis.tls.enabled=true" }}
{{- end }}
{{- if and $r.tls.ca.secretName $r.tls.ca.configMapName }}
{{- fail "redis.tls.ca: set secretName or configMapName, not both" }}
{{- end }}
{{- if and $v.autoscaling.enabled (lt ($v.autoscaling.maxReplicas | int) ($v.autoscaling.minReplicas | int)) }}
{{- fail "autoscaling.maxReplicas must be at least autoscaling.minReplicas" }}
{{- end }}
{{- $graceMs := add (mul ($v.lifecycle.preStopSleepSeconds | int) 1000) ($v.config.http.shutdownDrainDelayMs | default 0 | int) ($v.config.http.shutdownGraceMs | default 10000 | int) }}
{{- if le (mul ($v.terminationGracePeriodSeconds | int) 1000) $graceMs }}
{{- fail (printf "terminationGracePeriodSeconds (%d s) must exceed lifecycle.preStopSleepSeconds + config.http.shutdownDrainDelayMs + config.http.shutdownGraceMs (%d ms), or the kubelet kills the broker mid-drain" ($v.terminationGracePeriodSeconds | int) $graceMs) }}
{{- end }}
{{- if and $v.networkPolicy.enabled (include "token-broker.redisConfigured" .) (not (or $v.networkPolicy.egress.redis.cidrs $v.networkPolicy.egress.redis.peers)) }}
{{- fail "networkPolicy.egress.redis.cidrs (or .peers) is required with Redis: the NetworkPolicy would block the broker from reaching it (ElastiCache: its subnets' CIDRs)" }}
{{- end }}
{{- $egress := $v.networkPolicy.egress }}
{{- if and $v.networkPolicy.enabled (not (or $egress.aws.cidrs $egress.extra)) }}
{{- fail "networkPolicy.egress.aws.cidrs is required with the NetworkPolicy: the subnets of your VPC interface endpoints for Secrets Manager and STS (IRSA), e.g. [10.0.96.0/24]. The chart opens no egress to the internet by default; set [0.0.0.0/0] to allow any HTTPS destination, or write rules of your own in networkPolicy.egress.extra" }}
{{- end }}
{{- if and $v.networkPolicy.enabled (not (or $egress.provider.cidrs $egress.extra (has "0.0.0.0/0" $egress.aws.cidrs))) }}
{{- fail "networkPolicy.egress.provider.cidrs is required with the NetworkPolicy: the provider's auth server and API addresses (its published egress ranges), which the broker reaches over HTTPS; or write rules of your own in networkPolicy.egress.extra" }}
{{- end }}
{{- if and $v.csi.enabled (not $v.csi.objects) }}
{{- fail "csi.objects: list at least one secret to mount when csi.enabled is true" }}
{{- end }}
{{- /* The image runs with NODE_ENV=production: without these the pod would exit 78 in a loop. */}}
{{- $env := dict }}
{{- range $v.extraEnv }}{{ $_ := set $env .name true }}{{ end }}
{{- $extra := $v.config.extra | default dict }}
{{- $auth := $extra.callerAuth | default dict }}
{{- $mode := $auth.mode | default "" | toString }}
{{- if not (or $mode (hasKey $env "CALLER_AUTH_MODE")) }}
{{- fail "config.extra.callerAuth.mode is required: the image runs with NODE_ENV=production, where the broker refuses to start (exit 78) without caller authentication. Set api-key (with config.extra.callerAuth.apiKeysSource: {secretId: <ARN of the list of key hashes>}) or kubernetes (with config.extra.callerAuth.kubernetes.jwksUrl, issuer and subjects); see the README's Deploy section" }}
{{- end }}
{{- if eq $mode "none" }}
{{- fail "config.extra.callerAuth.mode none is refused by the broker in production (the image runs with NODE_ENV=production): use api-key or kubernetes" }}
{{- end }}
{{- if and (eq $mode "api-key") (not (or $auth.apiKeysSource $auth.apiKeys (hasKey $env "CALLER_API_KEYS_SECRET_ID") (hasKey $env "CALLER_API_KEYS_FILE"))) }}
{{- fail "config.extra.callerAuth.apiKeysSource is required in mode api-key: {secretId: <Secrets Manager name or ARN of the JSON list of key hashes>} or {file: <mounted path>}" }}
{{- end }}
{{- if and (eq $mode "kubernetes") $v.networkPolicy.enabled (not (or $egress.jwks.cidrs $egress.jwks.peers $egress.extra (has "0.0.0.0/0" $egress.aws.cidrs))) }}
{{- fail (printf "networkPolicy.egress.jwks.cidrs (or .peers) is required with config.extra.callerAuth.mode kubernetes and the NetworkPolicy: the broker fetches the cluster's signing keys from callerAuth.kubernetes.jwksUrl (%s), which the NetworkPolicy would block, so no caller could be authenticated. EKS's oidc.eks.<region>.amazonaws.com is a public host whose addresses change: [0.0.0.0/0] (HTTPS only) or your egress proxy's range; the API server (https://kubernetes.default.svc/openid/v1/jwks): the addresses and port of kubectl get endpoints kubernetes (networkPolicy.egress.jwks.ports). Or write rules of your own in networkPolicy.egress.extra" (($auth.kubernetes | default dict).jwksUrl | default "CALLER_AUTH_JWKS_URL")) }}
{{- end }}
{{- if eq $mode "kubernetes" }}
{{- $k8s := $auth.kubernetes | default dict }}
{{- range $key, $envName := dict "jwksUrl" "CALLER_AUTH_JWKS_URL" "issuer" "CALLER_AUTH_ISSUER" "subjects" "CALLER_AUTH_SUBJECTS" }}
{{- if not (or (get $k8s $key) (hasKey $env $envName)) }}
{{- fail (printf "config.extra.callerAuth.kubernetes.%s is required in mode kubernetes (see docs/security.md, Caller access)" $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (include "token-broker.redisConfigured" .) (not (($extra.cacheEncryption | default dict).key)) (not (or (hasKey $env "CACHE_KEY_SECRET_ID") (hasKey $env "CACHE_KEY_FILE"))) }}
{{- fail "config.extra.cacheEncryption.key is required with Redis: the image runs with NODE_ENV=production, where the broker refuses to store the token in Redis unencrypted (exit 78). Set {secretId: <Secrets Manager name or ARN of a base64 32-byte key>} (openssl rand -base64 32) or {file: <mounted path>}" }}
{{- end }}
{{- if eq (include "token-broker.testServiceAccountName" .) (include "token-broker.serviceAccountName" .) }}
{{- fail "tests.tokenFetch.serviceAccountName names the broker's own ServiceAccount, which carries its cloud role (IRSA): leave it empty (the test pod then gets one of its own) or name another" }}
{{- end }}
{{- $fetch := $v.tests.tokenFetch | default dict }}
{{- if and $fetch.enabled (eq $mode "api-key") }}
{{- $_ := include "token-broker.testApiKeySecretName" . }}
{{- end }}
{{- end }}

{{/*
The runbook annotation of an alert: where in docs/operations.md's Failures table the row about it is.
Args: (list $prometheusRuleValues "row name").
*/}}
{{- define "token-broker.runbook" -}}
{{- $r := index . 0 -}}
{{- printf "%q" (printf "docs/operations.md, Failures table, row %q%s" (index . 1) (ternary (printf " (%s)" $r.runbookUrl) "" (ne ($r.runbookUrl | default "") ""))) -}}
{{- end }}

{{/*
The caller authentication mode the values set (config.extra.callerAuth.mode), or empty.
*/}}
{{- define "token-broker.callerAuthMode" -}}
{{- (((.Values.config.extra | default dict).callerAuth | default dict).mode | default "") | toString -}}
{{- end }}

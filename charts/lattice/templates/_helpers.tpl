{{/* The release's base name: <release>-lattice, or the release name when it says lattice. */}}
{{- define "lattice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lattice.headless" -}}
{{- printf "%s-members" (include "lattice.fullname" .) -}}
{{- end -}}

{{- define "lattice.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "lattice.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "lattice.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The API's in-cluster address, where agents and clients go. */}}
{{- define "lattice.apiHost" -}}
{{- printf "%s.%s.svc" (include "lattice.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "lattice.jwtSecret" -}}
{{- .Values.jwt.existingSecret | default (printf "%s-jwt" (include "lattice.fullname" .)) -}}
{{- end -}}

{{/* A map of settings as TOML lines: JSON's strings, numbers, booleans and lists are TOML's. */}}
{{- define "lattice.toml" -}}
{{- range $key, $value := . }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end -}}

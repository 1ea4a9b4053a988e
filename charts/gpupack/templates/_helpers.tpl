{{/* Labels every object carries, after its own app.kubernetes.io/name and component. */}}
{{- define "gpupack.labels" -}}
app.kubernetes.io/part-of: gpupack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The ServiceAccount both scheduler containers run as, as the API server names its user. */}}
{{- define "gpupack.schedulerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpupack-scheduler
{{- end }}

{{/* The defrag loop's ServiceAccount, as the API server names its user. */}}
{{- define "gpupack.defragUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpupack-defrag
{{- end }}

{{- define "gpupack.agentUser" -}}
system:serviceaccount:{{ .Values.agent.namespace }}:gpupack-agent
{{- end }}

{{/* registry/repository@digest, else registry/repository:tag; the argument is an image value. */}}
{{- define "gpupack.imageRef" -}}
{{- $image := .image -}}
{{- $name := printf "%s/%s" $image.registry $image.repository | trimPrefix "/" -}}
{{- if $image.digest -}}
{{ $name }}@{{ $image.digest }}
{{- else -}}
{{ $name }}:{{ $image.tag | default .defaultTag }}
{{- end -}}
{{- end }}

{{- define "gpupack.image" -}}
{{ include "gpupack.imageRef" (dict "image" .Values.image "defaultTag" .Chart.AppVersion) }}
{{- end }}

{{/* kube-scheduler at the cluster's own version: a vendor suffix (v1.35.2-eks-...) is not an image tag. */}}
{{- define "gpupack.clusterVersion" -}}
{{- $version := semver .Capabilities.KubeVersion.Version -}}
v{{ $version.Major }}.{{ $version.Minor }}.{{ $version.Patch }}
{{- end }}

{{- define "gpupack.kubeSchedulerImage" -}}
{{ include "gpupack.imageRef" (dict "image" .Values.kubeScheduler.image "defaultTag" (include "gpupack.clusterVersion" .)) }}
{{- end }}

{{/* Every minor the chart installs on (kubeVersion >=1.33) serves kubescheduler.config.k8s.io/v1 and
nothing else (v1beta3 went in 1.29); a minor that serves another API gets its branch here. */}}
{{- define "gpupack.schedulerConfigApiVersion" -}}
{{- .Values.kubeScheduler.configApiVersion | default "kubescheduler.config.k8s.io/v1" -}}
{{- end }}

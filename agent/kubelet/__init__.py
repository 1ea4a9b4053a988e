"""The kubelet's gRPC contracts: device plugin v1beta1 and podresources v1 (Kubernetes v1.28.4).

`deviceplugin.proto` / `podresources.proto` are the upstream files with their gogoproto import and
options removed (they only steer Go code generation); the `_pb2` modules are generated from them by
`python -m agent.kubelet.generate` and committed, so neither an install nor the image needs protoc.
"""

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"  # in the device-plugin folder, /var/lib/kubelet/device-plugins
PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

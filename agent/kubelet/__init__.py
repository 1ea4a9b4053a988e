"""The kubelet's gRPC contracts: device plugin v1beta1 and podresources v1.

`deviceplugin.proto` / `podresources.proto` are gpupack's own definitions of the kubelet wire contract
(message and field names, numbers and types as the published Kubernetes APIs fix them, reduced to what
gpupack uses); the `_pb2` modules are generated from them by `python -m gpupack.agent.kubelet.generate`
and committed, so neither an install nor the image needs protoc.
"""

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"  # in the device-plugin folder, /var/lib/kubelet/device-plugins
PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

"""`gpupack agent`: the node half of gpupack (docs/contracts.md, issue #14).

It reads the GPUs through NVML, publishes the node's `gpupack.io/gpu-topology` and
`gpupack.io/mig-layout`, and is the kubelet's device plugin for the resources gpupack places, handing
each container exactly the devices its pod's `gpupack.io/assignment` names. It may import `scoring/`
and `extender/` helpers; they never import it.
"""

"""A whole small cluster on 127.0.0.1: the control plane with controllers and a default kube-scheduler.

`ControlPlane` (harness/controlplane.py) runs gpupack and its kube-scheduler as local processes. A real
node instead runs them as the shipped Deployment, and the shipped DaemonSet runs the agent; someone must
turn those into pods and place them. `FullControlPlane` therefore starts, beside etcd and
kube-apiserver, kube-controller-manager (the controllers those objects need) and a kube-scheduler with
the default profile, and no gpupack of its own.
"""

from __future__ import annotations

from gpupack.harness.controlplane import HOST, ControlPlane, free_port, insecure_context
from gpupack.harness.kube_programs import NEWEST, NODE_PROGRAMS, kube_bin_dir

# What the shipped objects need: workload controllers, the ServiceAccount and root-CA publishers that
# pods' projected tokens need, namespace and garbage collection. No node lifecycle controller: it
# would taint fake nodes of other tests that no kubelet heartbeats. `resourceclaim-controller` makes the
# ResourceClaims of pods' ResourceClaimTemplates and deletes them when their pods go (#30, DRA).
CONTROLLERS = (
    "deployment",
    "replicaset",
    "daemonset",
    "serviceaccount",
    "serviceaccount-token",
    "root-ca-cert-publisher",
    "namespace",
    "garbagecollector",
    "resourceclaim-controller",
    "disruption",  # PodDisruptionBudgets' status, which the Eviction API checks (#31, defrag)
)


class FullControlPlane(ControlPlane):
    """etcd, kube-apiserver, kube-controller-manager and the default kube-scheduler of one release."""

    def __init__(self, version: str = NEWEST, verbosity: int = 2) -> None:
        super().__init__(version, kube_bin=kube_bin_dir(version, NODE_PROGRAMS), verbosity=verbosity)

    def start(self, with_extender: bool = False) -> FullControlPlane:
        """Start everything and wait until each part answers; stops what started if one fails. `with_extender`:
        `gpupack serve` and the shipped kube-scheduler configuration (gpupack as its extender) instead of the
        default kube-scheduler."""
        try:
            self._start_api()
            self.start_controller_manager()
            if with_extender:
                self.start_gpupack()
                self.write_scheduler_config()
                self.start_scheduler()
            else:
                self.start_default_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def start_controller_manager(self) -> None:
        """kube-controller-manager with the CONTROLLERS only, no leader election."""
        certs = self._certs()
        port = free_port()
        argv = [
            *self._component("kube-controller-manager", port),
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={certs.service_account_key}",
            f"--root-ca-file={certs.ca_cert}",
            "--use-service-account-credentials=false",
        ]
        process = self._process("kube-controller-manager", argv).start()
        self._wait_http("kube-controller-manager", f"https://{HOST}:{port}/healthz", process, insecure_context())

    def start_default_scheduler(self) -> None:
        """kube-scheduler with its built-in configuration (profile `default-scheduler`)."""
        port = free_port()
        self.scheduler = self._process("default-scheduler", self._component("kube-scheduler", port)).start()
        self._wait_http("default kube-scheduler", f"https://{HOST}:{port}/healthz", self.scheduler, insecure_context())

    def _component(self, program: str, port: int) -> list[str]:
        """A control-plane program on the admin kubeconfig, no leader election, serving /healthz on `port`."""
        return [
            str(self.kube_bin / program),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            f"--bind-address={HOST}",
            f"--secure-port={port}",
            "--authorization-always-allow-paths=/healthz",
            f"--v={self.verbosity}",
        ]

"""A real Kubernetes control plane on 127.0.0.1 with gpupack as kube-scheduler's extender (issue #12).

`ControlPlane` starts etcd (Debian's `etcd-server`, from PATH), the upstream kube-apiserver and
kube-scheduler of one Kubernetes release (built from Go modules into a cache: `kube_programs`) and
`gpupack serve --kubeconfig` as the extender. kube-scheduler runs the KubeSchedulerConfiguration that
`manifests/scheduler-config.yaml` ships, with exactly three rewrites (`e2e_scheduler_config`): the
kubeconfig path, the extender's port and leader election off; a case may also ask for the extender's
`preemptVerb` to be left out (`preempt_verb=False`: kube-scheduler's own count-based victim choice, what
a config without the verb gets). Why each flag is there is said beside it.

Used by `tests/e2e/` and meant for a throughput benchmark, so nothing here depends on pytest. Every
process runs in its own process group and `stop()` kills all of them and removes the temporary folder,
whatever state the start-up reached.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from gpupack.errors import GpupackError
from gpupack.harness.certificates import Certificates, make_certificates
from gpupack.harness.kube_programs import NEWEST, MissingBinary, kube_bin_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
SCHEDULER_MANIFEST = REPO_ROOT / "manifests" / "scheduler-config.yaml"
HOST = "127.0.0.1"
# The only fields of the shipped KubeSchedulerConfiguration that the e2e run may change.
E2E_REWRITES = ("clientConnection.kubeconfig", "extenders[0].urlPrefix", "leaderElection.leaderElect")
GET_ETCD = "apt-get update && apt-get install -y etcd-server"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


class ControlPlaneError(GpupackError, RuntimeError):
    """The control plane could not be set up or did not answer in time."""


# ============================================================ programs
def find_etcd() -> str:
    """Path of `etcd` on PATH."""
    found = shutil.which("etcd")
    if found is None:
        raise MissingBinary(f"etcd is not on PATH; {GET_ETCD}")
    return found


# ============================================================ small helpers
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def http_status(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> int | None:
    """The HTTP status of GET `url`, None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return None


def insecure_context() -> ssl.SSLContext:
    """TLS without verification: kube-scheduler and the controller manager serve self-signed loopback certs."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def wait_until(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    """Call `check` until it is true; ControlPlaneError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ============================================================ processes
class Process:
    """A program in its own process group, its output in a log file; kill() takes the whole group."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env or {})  # on top of this process's environment
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        """Start the program, appending its stdout and stderr to the log file."""
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                start_new_session=True,
            )
        return self

    def running(self) -> bool:
        """True while the program has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: signal.Signals = signal.SIGKILL, grace: float = 5.0) -> None:
        """Send `sig` to the process group, then SIGKILL whatever is left after `grace` seconds."""
        if self.popen is None:
            return
        for signum in (sig, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)
            try:
                self.popen.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self.popen = None

    def log_text(self) -> str:
        """Everything the program wrote so far (all its runs)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def check_alive(self) -> None:
        """ControlPlaneError with the log's tail when the program has exited."""
        if not self.running():
            tail = "\n".join(self.log_text().splitlines()[-30:])
            raise ControlPlaneError(f"{self.name} exited; last lines of its log:\n{tail}")


# ============================================================ certificates and kubeconfig
def write_kubeconfig(path: Path, server: str, certs: Certificates) -> Path:
    """A kubeconfig for the admin client of `server`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(certs.ca_cert)}}],
        "users": [
            {"name": "admin", "user": {"client-certificate": str(certs.admin_cert), "client-key": str(certs.admin_key)}}
        ],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    return path


# ============================================================ the scheduler configuration
def shipped_scheduler_config(manifest: Path = SCHEDULER_MANIFEST) -> dict[str, Any]:
    """The KubeSchedulerConfiguration that `manifests/` ships (the ConfigMap's `data["config.yaml"]`)."""
    for document in yaml.safe_load_all(manifest.read_text()):
        if document and document.get("kind") == "ConfigMap":
            return yaml.safe_load(document["data"]["config.yaml"])
    raise ControlPlaneError(f"{manifest} holds no ConfigMap")


def e2e_scheduler_config(
    shipped: Mapping[str, Any], kubeconfig: Path, extender_port: int, preempt_verb: bool = True
) -> dict[str, Any]:
    """`shipped` with the three rewrites of E2E_REWRITES and nothing else changed.

    `preempt_verb=False` (asked for by a case, never the default) also drops the extender's `preemptVerb`,
    so kube-scheduler picks preemption victims by its own counting alone.
    """
    config = copy.deepcopy(dict(shipped))
    config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    extender = config["extenders"][0]
    url = urlsplit(extender["urlPrefix"])
    extender["urlPrefix"] = urlunsplit(url._replace(netloc=f"{url.hostname}:{extender_port}"))
    config.setdefault("leaderElection", {})["leaderElect"] = False
    if not preempt_verb:
        extender.pop("preemptVerb", None)
    return config


def write_scheduler_config(path: Path, kubeconfig: Path, extender_port: int, preempt_verb: bool = True) -> Path:
    """Write `e2e_scheduler_config` of the shipped configuration to `path` (what kube-scheduler runs)."""
    config = e2e_scheduler_config(shipped_scheduler_config(), kubeconfig, extender_port, preempt_verb)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ============================================================ the control plane
class ControlPlane:
    """etcd, kube-apiserver, kube-scheduler and `gpupack serve` on 127.0.0.1; a context manager."""

    def __init__(
        self, version: str = NEWEST, kube_bin: Path | None = None, etcd: str | None = None, verbosity: int = 2
    ) -> None:
        self.version = version
        self.kube_bin = kube_bin or kube_bin_dir(version)
        self.etcd_program = etcd or find_etcd()
        self.verbosity = verbosity
        self.workdir = Path(tempfile.mkdtemp(prefix="gpupack-e2e-"))
        self.apiserver_port = free_port()
        self.scheduler_port = free_port()
        self.gpupack_port = free_port()
        self.etcd: Process | None = None
        self.apiserver: Process | None = None
        self.scheduler: Process | None = None
        self.gpupack: Process | None = None
        self.certs: Certificates | None = None
        self.kubeconfig = self.workdir / "kubeconfig"
        self.scheduler_config_path = self.workdir / "scheduler-config.yaml"
        self._api_client: Any = None
        self.processes: list[Process] = []  # every one started, in order; stop() kills them in reverse
        self.gpupack_env: dict[str, str] = {}  # set for `gpupack serve` on top of this process's environment

    # ------------------------------------------------ lifecycle
    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start everything and wait until each part answers; stops what started if one fails."""
        try:
            self._start_api()
            self.start_gpupack()
            self.write_scheduler_config()
            self.start_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_api(self) -> None:
        """Certificates, the admin kubeconfig, etcd and kube-apiserver (what every variant needs)."""
        atexit.register(self.stop)
        self.certs = make_certificates(self.workdir / "pki")
        write_kubeconfig(self.kubeconfig, f"https://{HOST}:{self.apiserver_port}", self.certs)
        self.start_etcd()
        self.start_apiserver()

    def stop(self) -> None:
        """Kill every process group and remove the temporary folder (safe to call twice)."""
        for process in reversed(self.processes):
            process.kill(signal.SIGTERM, grace=3.0)
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                self._api_client.close()
            self._api_client = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.stop)

    # ------------------------------------------------ etcd and kube-apiserver
    def start_etcd(self) -> None:
        """etcd with a data folder under the work folder, client and peer URLs on free ports."""
        client_url, peer_url = f"http://{HOST}:{free_port()}", f"http://{HOST}:{free_port()}"
        self.etcd_url = client_url
        argv = [
            self.etcd_program,
            "--name=e2e",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            "--log-level=warn",
            "--logger=zap",
        ]
        self.etcd = self._process("etcd", argv).start()
        self._wait_http("etcd", f"{client_url}/health", self.etcd, timeout=60)

    def start_apiserver(self) -> None:
        """kube-apiserver over etcd, RBAC and the default admission plugins; waits for /readyz."""
        certs = self._certs()
        argv = [
            str(self.kube_bin / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={self.apiserver_port}",
            "--service-cluster-ip-range=10.0.0.0/24",
            # from 1.37 a loopback advertise address is refused for the `kubernetes` Service's
            # endpoints; nothing here routes Service IPs anyway (pods are told 127.0.0.1 directly)
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={certs.serving_cert}",
            f"--tls-private-key-file={certs.serving_key}",
            f"--client-ca-file={certs.ca_cert}",
            f"--service-account-key-file={certs.service_account_pub}",
            f"--service-account-signing-key-file={certs.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",  # as kubeadm and every managed control plane set it
            "--profiling=false",
            "--v=1",
        ]
        self.apiserver = self._process("kube-apiserver", argv).start()
        self._wait_http("kube-apiserver", f"{self.apiserver_url}/readyz", self.apiserver, self.client_ssl(), 120)

    @property
    def apiserver_url(self) -> str:
        """https://127.0.0.1:PORT of kube-apiserver."""
        return f"https://{HOST}:{self.apiserver_port}"

    def client_ssl(self) -> ssl.SSLContext:
        """TLS context that trusts the CA and presents the admin client certificate."""
        certs = self._certs()
        context = ssl.create_default_context(cafile=str(certs.ca_cert))
        context.load_cert_chain(str(certs.admin_cert), str(certs.admin_key))
        return context

    # ------------------------------------------------ gpupack
    def start_gpupack(self, timeout: float = 180) -> None:
        """`gpupack serve --kubeconfig` on its port (the same one on every restart); waits for /readyz."""
        argv = [
            sys.executable,
            "-m",
            "gpupack.cli",
            "serve",
            "--kubeconfig",
            str(self.kubeconfig),
            "--host",
            HOST,
            "--port",
            str(self.gpupack_port),
        ]
        self.gpupack = self._process("gpupack", argv, cwd=REPO_ROOT, env=self.gpupack_env).start()
        self._wait_http("gpupack", f"http://{HOST}:{self.gpupack_port}/readyz", self.gpupack, timeout=timeout)

    def kill_gpupack(self) -> None:
        """SIGKILL gpupack (no chance to clean up)."""
        if self.gpupack is not None:
            self.gpupack.kill()

    def restart_gpupack(self) -> None:
        """SIGKILL gpupack, then start it again; it rebuilds its state from the API server."""
        self.kill_gpupack()
        self.start_gpupack()

    def gpupack_log(self) -> str:
        """What gpupack wrote, all runs."""
        return self.gpupack.log_text() if self.gpupack else ""

    def gpupack_metric(self, name: str) -> float | None:
        """The value of an unlabelled gpupack metric from /metrics, None when absent or unreachable."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.gpupack_port}/metrics", timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        return None

    # ------------------------------------------------ kube-scheduler
    def write_scheduler_config(self, preempt_verb: bool = True) -> Path:
        """Write the shipped configuration with the e2e rewrites for this control plane (a running
        kube-scheduler reads it at its next start: `restart_scheduler`)."""
        return write_scheduler_config(self.scheduler_config_path, self.kubeconfig, self.gpupack_port, preempt_verb)

    def start_scheduler(self, timeout: float = 90) -> None:
        """kube-scheduler with `--config` (the shipped configuration, rewritten); waits for /healthz."""
        argv = [
            str(self.kube_bin / "kube-scheduler"),
            f"--config={self.scheduler_config_path}",
            f"--bind-address={HOST}",
            f"--secure-port={self.scheduler_port}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            f"--v={self.verbosity}",
        ]
        self.scheduler = self._process("kube-scheduler", argv).start()
        self._wait_http(
            "kube-scheduler",
            f"https://{HOST}:{self.scheduler_port}/healthz",
            self.scheduler,
            insecure_context(),
            timeout,
        )

    def kill_scheduler(self) -> None:
        """SIGKILL kube-scheduler."""
        if self.scheduler is not None:
            self.scheduler.kill()

    def restart_scheduler(self) -> None:
        """SIGKILL kube-scheduler, then start it again."""
        self.kill_scheduler()
        self.start_scheduler()

    def scheduler_log(self) -> str:
        """What kube-scheduler wrote, all runs."""
        return self.scheduler.log_text() if self.scheduler else ""

    # ------------------------------------------------ the official kubernetes client
    def api_client(self) -> Any:
        """One `kubernetes.client.ApiClient` for the admin user (made on first use)."""
        if self._api_client is None:
            from kubernetes import client, config

            configuration = client.Configuration()
            config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
            configuration.connection_pool_maxsize = 16
            self._api_client = client.ApiClient(configuration)
        return self._api_client

    def core(self) -> Any:
        """`kubernetes.client.CoreV1Api` on the admin client."""
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Create a namespace and its `default` ServiceAccount.

        Without a controller-manager nothing else makes that account, and the ServiceAccount admission
        plugin (on, as in any cluster) refuses pods whose account does not exist.
        """
        core = self.core()
        metadata = {"name": name, "labels": dict(labels or {})}
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": metadata})
        from kubernetes.client.exceptions import ApiException

        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        try:
            core.create_namespaced_service_account(name, account)
        except ApiException as exc:
            if exc.status != 409:  # a controller-manager, where one runs, may have made it first
                raise

    def create_node(self, body: Mapping[str, Any]) -> None:
        """Create a Node (its `.status` is kept) and merge-patch away the not-ready taint the API server adds."""
        core = self.core()
        created = core.create_node(dict(body))
        taints = [t for t in (created.spec.taints or []) if t.key != NOT_READY_TAINT]
        kept = [core.api_client.sanitize_for_serialization(t) for t in taints]
        core.patch_node(
            created.metadata.name, {"spec": {"taints": kept or None}}, _content_type="application/merge-patch+json"
        )

    def create_nodes(self, bodies: Iterable[Mapping[str, Any]], threads: int = 8) -> None:
        """Create many nodes from a few client threads."""
        _in_parallel(self.create_node, bodies, threads)

    def delete_node(self, name: str) -> None:
        """Delete a node now."""
        self.core().delete_node(name, grace_period_seconds=0)

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a pod in `namespace`."""
        self.core().create_namespaced_pod(namespace, dict(body))

    def create_pods(self, namespace: str, bodies: Iterable[Mapping[str, Any]], threads: int = 8) -> None:
        """Create many pods from a few client threads."""
        _in_parallel(lambda body: self.create_pod(namespace, body), bodies, threads)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete one pod at once (no kubelet would ever confirm a graceful deletion)."""
        self.core().delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def delete_pods(self, namespace: str) -> None:
        """Delete every pod of `namespace` at once (no kubelet would ever confirm a graceful deletion)."""
        self.core().delete_collection_namespaced_pod(namespace, grace_period_seconds=0)

    # ------------------------------------------------ internals
    def _certs(self) -> Certificates:
        if self.certs is None:
            raise ControlPlaneError("certificates are made by start()")
        return self.certs

    def _process(
        self, name: str, argv: list[str], cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> Process:
        process = Process(name, argv, self.workdir / f"{name}.log", cwd, env)
        self.processes.append(process)
        return process

    def _wait_http(
        self, what: str, url: str, process: Process, context: ssl.SSLContext | None = None, timeout: float = 60
    ) -> None:
        """Wait until `url` answers 200, failing early (with the log) if `process` exits."""

        def ready() -> bool:
            process.check_alive()
            return http_status(url, context) == 200

        wait_until(f"{what} at {url}", ready, timeout)


def _in_parallel(work: Callable[[Any], None], items: Iterable[Any], threads: int) -> None:
    """Run `work` on every item from `threads` threads; re-raises the first failure."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(work, item) for item in items]:
            future.result()


# ============================================================ object builders
def node_body(
    name: str,
    allocatable: Mapping[str, str | int],
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node with `allocatable` (also its capacity) and a Ready condition, as a kubelet would report it."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "250", **{k: str(v) for k, v in allocatable.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}],
        },
    }


def pod_body(
    name: str,
    limits: Mapping[str, str | int],
    annotations: Mapping[str, str] | None = None,
    node_affinity: Mapping[str, list[str]] | None = None,
    scheduler_name: str = "gpupack",
) -> dict[str, Any]:
    """A one-container pod with `limits` (requests default to them), for `scheduler_name`.

    `node_affinity` maps a label key to the values one of which the node must carry (required affinity).
    """
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/gpupack-e2e:0",
                "resources": {
                    "requests": {"cpu": "100m", "memory": "128Mi"},
                    "limits": {k: str(v) for k, v in limits.items()},
                },
            }
        ],
    }
    if node_affinity:
        terms = [{"key": key, "operator": "In", "values": list(values)} for key, values in node_affinity.items()]
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": terms}]}
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": spec,
    }

# gpupack: the extender sidecar image (ghcr.io/gpupack/gpupack:<version>).
#   docker build -t ghcr.io/gpupack/gpupack:0.1.0 .
#   docker run --rm --network host ghcr.io/gpupack/gpupack:0.1.0   # the example cluster on 127.0.0.1:8888
# The default command listens on 127.0.0.1 only, as the sidecar does: to reach it from elsewhere,
# say so (`... serve --cluster-file /usr/share/gpupack/cluster.yaml --host 0.0.0.0`).
# In the cluster (manifests/deployment.yaml) it runs `gpupack serve --host 127.0.0.1 ...` next to
# kube-scheduler, as uid 10001, with a read-only root filesystem and an emptyDir at /tmp.
# BASE: any image with python/pip 3.11 on PATH and a writable site-packages; the e2e suite, which cannot
# pull from a registry, builds one from Debian packages (tests/e2e/images.py: --build-arg BASE=localhost/...).
# Pinned by digest (a tag moves: the same build could get another base tomorrow). To move it, read the
# tag's current digest (`docker buildx imagetools inspect python:3.11-slim`) and put it here.
ARG BASE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# the dependencies exactly as locked, each file checked against its hash (`make lock` writes the lock)
COPY requirements.lock ./
RUN pip wheel --wheel-dir /wheels --require-hashes -r requirements.lock
# README.m[d]: pyproject.toml names README.md as the long description; LICENSE: its license-files
COPY pyproject.toml README.m[d] LICENSE ./
# one line per component of pyproject.toml's package-dir (tests/project/test_components.py holds them equal)
COPY gpupack/ gpupack/
COPY scoring/ scoring/
COPY kube/ kube/
COPY extender/ extender/
COPY agent/ agent/
COPY sim/ sim/
COPY harness/ harness/
COPY report/ report/
COPY bench/ bench/
COPY defrag/ defrag/
RUN pip wheel --wheel-dir /wheels --no-deps .

FROM ${BASE}
# The root filesystem is read-only in the cluster: numba's kernel cache goes
# to /tmp (an emptyDir there). The kernels are compiled at build time into the seed cache, which
# `gpupack serve` copies into the emptyDir before any kernel runs (extender/numba_cache.py).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    GPUPACK_NUMBA_CACHE_SEED=/opt/gpupack/numba-cache
RUN groupadd --system --gid 10001 gpupack \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpupack
COPY --from=build /wheels /wheels
# no extras: matplotlib (the `bench` extra) is not in the image; byte-compile at build time: at run time site-packages is read-only
RUN pip install --no-index --no-compile /wheels/*.whl && rm -rf /wheels \
 && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# every kernel, compiled through the warm-up's real request path, into the seed cache
RUN NUMBA_CACHE_DIR=/opt/gpupack/numba-cache python -c \
        "from gpupack.extender.settings import Settings; from gpupack.extender.state import ClusterState; from gpupack.extender.warm_up import warm_up; warm_up(ClusterState(Settings()))" \
 && chmod -R a+rX /opt/gpupack
COPY manifests/examples/cluster.yaml /usr/share/gpupack/cluster.yaml
# numeric, so kubelet can check runAsNonRoot
USER 10001:10001
EXPOSE 8888
ENTRYPOINT ["gpupack"]
CMD ["serve", "--cluster-file", "/usr/share/gpupack/cluster.yaml", "--host", "127.0.0.1", "--port", "8888"]

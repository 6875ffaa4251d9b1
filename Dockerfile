# dcgm-enricher container image. No registry publishes it: build it and push it to yours.
#
#   make image                                 # dcgm-enricher:<version>, labelled
#   make image-push REGISTRY=<your registry>   # <your registry>/dcgm-enricher:<version>
#
# `make image` adds the labels org.opencontainers.image.revision (the commit) and .source (the
# repository, from `git remote get-url origin`) that a plain `docker build .` leaves out;
# docs/release.md has the multi-arch build (linux/amd64 and linux/arm64).
#
# Both stages use the same Python image: the virtualenv's interpreter is a link to that
# image's /usr/local/bin/python3.12, so the final stage must have Python at the same path.

# Pin by digest as well (python:3.12-slim-bookworm@sha256:...) for byte-for-byte rebuilds.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md LICENSE ./
COPY enricher ./enricher
# The final image gets only the venv: pip is removed, as nothing installs at run time.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install /wheels/*.whl \
 && /opt/venv/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
# pyproject.toml's version (make release-check holds them equal; make image passes it).
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="dcgm-enricher" \
      org.opencontainers.image.description="Attributes dcgm-exporter GPU metrics to Kubernetes pods and containers" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/venv /opt/venv
# The image runs with a read-only root filesystem; bytecode was compiled at install time.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user needs no /etc/passwd entry, and lets the kubelet verify runAsNonRoot.
USER 10001:10001
EXPOSE 9401
ENTRYPOINT ["/opt/venv/bin/dcgm-enricher"]
CMD ["serve"]

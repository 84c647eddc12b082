# Party B (label holder): the `fedlite-b serve` HTTP service.
#   docker build -f docker/party_b.Dockerfile -t fedlite-b .      (from the repository root)
# Volumes: /data (label table, read-only), /state (SQLite file, PSI key; back it up),
# /certs (TLS certificate and key; owned by the image's user, so that a fresh named volume is
# too and the compose demo's certificate job can write into it).
# Config: FEDLITE_B_* environment variables (docker/env/party_b.env), see docs/DEPLOY.md.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The CPU-only torch wheel; docker/install.sh installs it first, exactly as `make install` does.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /src
# torch in a layer of its own, before any code: it is rebuilt only when install.sh or the pins
# change, so a code change does not download its 192 MB wheel (754 MB installed) again.
COPY docker/install.sh docker/install.sh
COPY constraints.txt constraints.txt
RUN PYTHON=python3.11 TORCH_INDEX_URL="$TORCH_INDEX_URL" sh docker/install.sh /opt/venv
# then the project and its dependencies, every version pinned by constraints.txt
COPY pyproject.toml README.md ./
COPY api_schemas api_schemas
COPY shared shared
COPY party_a party_a
COPY party_b party_b
RUN PYTHON=python3.11 TORCH_INDEX_URL="$TORCH_INDEX_URL" sh docker/install.sh /opt/venv '.[postgres]'

FROM python:3.11-slim-bookworm
# GNU OpenMP, for numba's thread-safe threading layer: k-means passes on several threads
# (shared/pq/_threads.py; without it k-means runs on one thread, same bytes). Unpinned:
# Debian's security updates replace a pinned version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --no-create-home fedlite \
    && mkdir -p /data /state /certs \
    && chown fedlite:fedlite /state /certs
COPY --from=build /opt/venv /opt/venv
# serving from the exports without either service (docs/DEPLOY.md section 6)
COPY examples/serve_export.py /opt/fedlite/serve_export.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    FEDLITE_B_HOST=0.0.0.0 \
    FEDLITE_B_PORT=8443 \
    FEDLITE_B_DATA_DIR=/state
USER 10001:10001
WORKDIR /state
VOLUME ["/state"]
EXPOSE 8443
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["fedlite-b", "health"]
ENTRYPOINT ["fedlite-b"]
CMD ["serve"]

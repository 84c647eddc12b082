# Party A (feature holder): the `fedlite-a` trainer (align, train, evaluate, predict).
#   docker build -f docker/party_a.Dockerfile -t fedlite-a .      (from the repository root)
# Volumes: /data (feature table, read-only), /state (party A's checkpoints and PSI cache).
# Both belong to the image's user, so fresh named volumes do too (the demo-data job writes
# into them).
# Config: FEDLITE_A_SERVER, FEDLITE_A_TOKEN, FEDLITE_A_CA_BUNDLE (docker/env/party_a.env) and
# a run config (TOML) mounted read-only, see docs/DEPLOY.md.

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
RUN PYTHON=python3.11 TORCH_INDEX_URL="$TORCH_INDEX_URL" sh docker/install.sh /opt/venv .

FROM python:3.11-slim-bookworm
# GNU OpenMP, for numba's thread-safe threading layer: k-means passes on several threads
# (shared/pq/_threads.py; without it k-means runs on one thread, same bytes). Unpinned:
# Debian's security updates replace a pinned version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --no-create-home fedlite \
    && mkdir -p /data /state \
    && chown fedlite:fedlite /data /state
COPY --from=build /opt/venv /opt/venv
# serving from the exports without either service (docs/DEPLOY.md section 6)
COPY examples/serve_export.py /opt/fedlite/serve_export.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /state
VOLUME ["/state"]
# Healthy while party B answers and accepts the token (FEDLITE_A_SERVER / FEDLITE_A_TOKEN).
HEALTHCHECK --interval=60s --timeout=30s --start-period=30s --retries=3 \
    CMD ["fedlite-a", "check", "--retry-for", "10"]
ENTRYPOINT ["fedlite-a"]
CMD ["--help"]

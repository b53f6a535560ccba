# Sluice: multi-stage build, non-root runtime, embedded defaults (SQLite + in-process state).
# The default (last) target is the server, without Streamlit; the admin app is target "admin".
#   docker build -t sluice .
#   docker run -p 8080:8080 -p 8081:8081 -p 8082:8082 -v sluice-data:/var/lib/sluice sluice
#   docker run ... sluice serve --config /usr/share/sluice/examples/ratelimit.yaml
#   docker build --target admin -t sluice-admin .
#   docker run -p 8501:8501 -e SLUICE_ADMIN_USERS=... -v sluice-data:/var/lib/sluice sluice-admin

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A C compiler: mypyc compiles the request path (setup.py); only this stage has it. Not
# pinned: bookworm's security updates replace exact versions, which would break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python -m venv /opt/sluice
# Pinned dependencies first (requirements.lock: reproducible images), then Sluice itself.
COPY requirements.lock ./
RUN /opt/sluice/bin/pip install -r requirements.lock
COPY pyproject.toml setup.py README.md ./
COPY server ./server
COPY admin ./admin
RUN /opt/sluice/bin/pip install --no-deps . && /opt/sluice/bin/pip check

# The server's venv plus the admin extra (Streamlit and what it brings).
FROM build AS build-admin
RUN /opt/sluice/bin/pip install '.[admin]'

# What both images share: the user, the data volume, the defaults, the entry point.
FROM python:3.11-slim-bookworm AS runtime
RUN groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid sluice --home-dir /var/lib/sluice --create-home sluice
COPY examples /usr/share/sluice/examples
ENV PATH=/opt/sluice/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SLUICE_DATABASE_URL=sqlite:////var/lib/sluice/sluice.db
USER 10001:10001
WORKDIR /var/lib/sluice
VOLUME ["/var/lib/sluice"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["sluice"]

# The admin app (`sluice admin`), run beside the servers; see docker-compose.yml.
FROM runtime AS admin
COPY --from=build-admin /opt/sluice /opt/sluice
EXPOSE 8501
CMD ["admin", "--port", "8501", "--address", "0.0.0.0"]

# The server, last so that a plain `docker build` makes it.
FROM runtime AS server
COPY --from=build /opt/sluice /opt/sluice
# gRPC (ShouldRateLimit, health, reflection), HTTP (/healthcheck, /json, /api) and the
# management port (/healthcheck, /ready, /metrics), plaintext even when the others use TLS,
# so this health check works with TLS and mTLS on.
ENV SLUICE_MANAGEMENT_PORT=8082
EXPOSE 8081 8080 8082
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ['SLUICE_MANAGEMENT_PORT']; sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthcheck', timeout=2).status == 200 else 1)"]
CMD ["serve"]

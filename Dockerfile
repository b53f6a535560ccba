# Sluice: multi-stage build, non-root runtime, embedded defaults (SQLite + in-process state).
#   docker build -t sluice .
#   docker run -p 8080:8080 -p 8081:8081 -v sluice-data:/var/lib/sluice sluice
#   docker run ... sluice serve --config /usr/share/sluice/examples/ratelimit.yaml

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/sluice
COPY pyproject.toml README.md ./
COPY server ./server
COPY admin ./admin
RUN /opt/sluice/bin/pip install .

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid sluice --home-dir /var/lib/sluice --create-home sluice
COPY --from=build /opt/sluice /opt/sluice
COPY examples /usr/share/sluice/examples
ENV PATH=/opt/sluice/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SLUICE_DATABASE_URL=sqlite:////var/lib/sluice/sluice.db
USER 10001:10001
WORKDIR /var/lib/sluice
VOLUME ["/var/lib/sluice"]
# gRPC (ShouldRateLimit, health, reflection), HTTP (/healthcheck, /json, /api) and the admin
# app (`sluice admin`, run as a second container from this image; see docker-compose.yml).
EXPOSE 8081 8080 8501
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('SLUICE_HTTP_PORT', '8080'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthcheck', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["sluice"]
CMD ["serve"]

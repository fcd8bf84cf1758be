# syntax=docker/dockerfile:1
# Build every wheel in one stage: the project's (with the Alembic migrations inside) and those of
# the dependency versions CI tested (requirements/relay.txt: pinned, with hashes, checked here),
# mysqlclient among them, compiled against the MariaDB C client. Install them in a slim stage
# that has the C client's library but no compiler.
FROM python:3.11-slim-bookworm AS build
# Not pinned (DL3008): security updates replace these versions; the base tag pins the release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libmariadb-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements/relay.txt ./
RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels -r relay.txt
COPY pyproject.toml README.md ./
COPY relay ./relay
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libmariadb3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin relay
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --no-deps /wheels/*.whl \
 && rm -rf /wheels
USER 10001
ENV RELAY_METRICS_PORT=9840 \
    PYTHONUNBUFFERED=1
EXPOSE 9840
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9840/healthz', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["relay"]
CMD ["run"]

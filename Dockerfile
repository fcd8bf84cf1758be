# syntax=docker/dockerfile:1
# Build the wheel (with the Alembic migrations inside) in one stage; install it in a slim one,
# on top of the dependency versions CI tested (requirements/relay.txt: pinned, with hashes).
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY relay ./relay
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin relay
COPY requirements/relay.txt /tmp/relay.txt
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --require-hashes -r /tmp/relay.txt \
 && pip install --no-cache-dir --no-deps /wheels/outbox_relay-*.whl \
 && rm -rf /wheels /tmp/relay.txt
USER 10001
ENV RELAY_METRICS_PORT=9840 \
    PYTHONUNBUFFERED=1
EXPOSE 9840
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9840/healthz', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["relay"]
CMD ["run"]

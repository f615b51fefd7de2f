# syntax=docker/dockerfile:1
# connect-coordinator: build a wheel (and wheels of its dependencies), then install them
# into a slim runtime that runs as a non-root user with its state in /data.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY coordinator ./coordinator
COPY protocol ./protocol
COPY bench ./bench
# Wheels for the project and every dependency, so the runtime needs no compiler or index.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 coordinator \
    && useradd --system --uid 10001 --gid coordinator --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin coordinator \
    && mkdir -p /data \
    && chown coordinator:coordinator /data
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links=/tmp/wheels connect-coordinator \
    && rm -rf /tmp/wheels
USER coordinator
WORKDIR /data
VOLUME /data
# 19092: the KRPC listener workers connect to; 19093: admin HTTP (/metrics, /healthz, /readyz).
EXPOSE 19092 19093
# The slim image has no curl; urlopen raises on a non-2xx answer, which fails the check.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:19093/healthz', timeout=3)"]
ENTRYPOINT ["connect-coordinator", "serve", "--listen", "0.0.0.0:19092", "--admin-listen", "0.0.0.0:19093", "--data-dir", "/data"]

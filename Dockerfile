# The rsnet stream broker.
#
#   docker build -t rsnet .
#   docker run -p 7600:7600 -p 7601:7601 -p 127.0.0.1:9100:9100 -v rsnet-data:/var/lib/rsnet rsnet
#
# (the metrics port has no auth: publish it on the host's loopback only, as here)
#
# Configuration: /etc/rsnet/rsnet.toml (server/docker.toml: every topic durable on the volume,
# listening on all interfaces, JSON logs; auth OFF until you mount your own file with tokens
# over it, and the broker warns about it at startup), then RSNET_BROKER__* variables given with
# `docker run -e`, then arguments appended to `docker run ... rsnet` (e.g. --fsync interval).
# See server/README.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /tmp/rsnet-src
COPY pyproject.toml README.md ./
COPY rsnet ./rsnet
RUN pip install . && cd / && rm -rf /tmp/rsnet-src

RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/rsnet --shell /usr/sbin/nologin rsnet \
    && mkdir -p /var/lib/rsnet /etc/rsnet \
    && chown rsnet:rsnet /var/lib/rsnet
COPY server/docker.toml /etc/rsnet/rsnet.toml

USER rsnet
WORKDIR /var/lib/rsnet
VOLUME /var/lib/rsnet
EXPOSE 7600 7601 9100

HEALTHCHECK --interval=30s --timeout=5s --start-period=10s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/health', timeout=4)"]

ENTRYPOINT ["rsnet", "broker", "--config", "/etc/rsnet/rsnet.toml"]

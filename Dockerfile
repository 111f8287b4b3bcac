# The rsnet stream broker.
#
#   docker build -t rsnet .
#   docker run -p 7600:7600 -p 7601:7601 -p 9100:9100 -v rsnet-data:/var/lib/rsnet rsnet
#
# Configuration: /etc/rsnet/rsnet.toml (server/rsnet.toml; mount your own over it), then the
# RSNET_BROKER__* variables below and any given with `docker run -e`, then arguments appended
# to `docker run ... rsnet` (e.g. --fsync interval). See server/README.md.
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
COPY server/rsnet.toml /etc/rsnet/rsnet.toml

# Inside a container: listen on every interface, keep topics on the volume, log JSON lines.
ENV RSNET_BROKER__DATA_DIR=/var/lib/rsnet \
    RSNET_BROKER__LISTEN__TCP=0.0.0.0:7600 \
    RSNET_BROKER__LISTEN__WS=0.0.0.0:7601 \
    RSNET_BROKER__METRICS__LISTEN=0.0.0.0:9100 \
    RSNET_BROKER__LOG__FORMAT=json

USER rsnet
WORKDIR /var/lib/rsnet
VOLUME /var/lib/rsnet
EXPOSE 7600 7601 9100

HEALTHCHECK --interval=30s --timeout=5s --start-period=10s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/health', timeout=4)"]

ENTRYPOINT ["rsnet", "broker", "--config", "/etc/rsnet/rsnet.toml"]

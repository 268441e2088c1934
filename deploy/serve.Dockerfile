# vaecast on one machine: `vaecast serve` on 0.0.0.0:8000, refusing to start without an
# API key, run by a user who is not root. (deploy/Dockerfile is the Ray cluster's image.)
#
#   docker build -f deploy/serve.Dockerfile -t vaecast:cpu .
#   docker build -f deploy/serve.Dockerfile --build-arg TORCH=cu126 -t vaecast:cuda .
#   docker run -p 8000:8000 -e VAECAST_API_KEY="$(openssl rand -hex 32)" vaecast:cpu
#   docker run --gpus all -p 8000:8000 -e VAECAST_API_KEY=... vaecast:cuda --device cuda
#
# Arguments after the image name are `vaecast serve` options; weights are mounted, never
# downloaded (`-v ~/weights:/weights:ro ... --model taehv --weights /weights/taew2_1.safetensors`).
# Checked by tests/test_serve_image.py (hadolint, and its command against vaecast's own
# parser); not built in this project's CI, which has no Docker engine.
ARG PYTHON=3.11
FROM python:${PYTHON}-slim

# torch first, from PyTorch's index for the variant (cpu: no CUDA libraries; cu126 and
# the like: CUDA's own libraries come as wheels, the host's driver through --gpus):
# vaecast's torch range then keeps it.
ARG TORCH=cpu
RUN pip install --no-cache-dir --index-url "https://download.pytorch.org/whl/${TORCH}" \
        "torch>=2.4,<3"

WORKDIR /opt/vaecast
COPY pyproject.toml README.md ./
COPY vaecast ./vaecast
RUN pip install --no-cache-dir . \
    && useradd --no-log-init --create-home --uid 10001 vaecast \
    && mkdir /data \
    && chown vaecast /data

# By number: a runtime that checks "not root" cannot read names from the image.
USER 10001
# Every serve option also reads VAECAST_<OPTION>: jobs and finished videos go to the
# /data volume, and a start without VAECAST_API_KEY ends with one line. Another port:
# `-e VAECAST_PORT=...`, not --port, so that the health check asks the right one. (DL3064 takes
# REQUIRE_API_KEY, a switch, for a secret; the key itself is given at `docker run`.)
# hadolint ignore=DL3064
ENV PYTHONUNBUFFERED=1 \
    VAECAST_PORT=8000 \
    VAECAST_STORE=/data \
    VAECAST_REQUIRE_API_KEY=1
VOLUME ["/data"]
EXPOSE 8000
# Ready (200) while jobs are admitted; 503 while draining or once the warm-up failed.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ['VAECAST_PORT'], timeout=4)"]
# vaecast is PID 1: SIGTERM drains (no new jobs; running ones get --shutdown-grace).
ENTRYPOINT ["vaecast", "serve", "--host", "0.0.0.0"]

# One image for every AML service (compose.yaml picks the service with its command:
# `python -m aml_gateway`, `python -m aml_scheduler`, ...). Installs the project from the
# repository's own files with exactly the locked dependencies (requirements-service.lock: every
# transitive one pinned and checked by its hashes); runs as a non-root user.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml requirements-service.lock /src/
COPY libs /src/libs
COPY services /src/services
# nltk's punkt_tab model for BLEU-1, pinned by sha256, into /usr/local/nltk_data (on nltk's
# search path); the scorer refuses to start without it and never downloads at run time. The local
# LLM (xllamacpp and its model, `python -m aml_devtools.install_model`) belongs to the embedded
# stack only and is not in the image: the services here call the LLM at AML_LLM_BASE_URL.
# Developer tooling (libs/devtools: the embedded stack, the `aml` CLI) and the tools/ a team or a
# benchmark runs (reference memory server, participant simulator, LLM stand-in) are left out by
# .dockerignore, so the `aml` script pip writes from pyproject.toml would only fail: removed.
RUN pip install --require-hashes --only-binary=:all: --no-deps -r /src/requirements-service.lock \
    && pip install --no-deps /src && rm /usr/local/bin/aml \
    && python -m aml_runtime.install_punkt && rm -rf /src

RUN useradd --system --uid 10001 --create-home --home-dir /home/aml aml
USER 10001:10001
WORKDIR /home/aml

# 8000: the gateway; 9464: a worker's /health, /ready and /metrics (AML_METRICS_PORT).
EXPOSE 8000 9464
CMD ["python", "-m", "aml_gateway"]

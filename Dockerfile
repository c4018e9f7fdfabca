# One image for every AML service (compose.yaml picks the service with its command:
# `python -m aml_gateway`, `python -m aml_scheduler`, ...). Installs the project from the
# repository's own files with exactly the locked dependencies (requirements-service.lock: every
# transitive one pinned and checked by its hashes); runs as a non-root user.
#
# Two targets:
#   service  every service (`docker build --target service -t aml .`; also what a plain
#            `docker build .` makes: the last stage below is this one again);
#   coding   the same image plus what the coding track's sandbox needs on the worker
#            (aml_pipeline.sandbox): Debian's bubblewrap, git and /usr/bin/python3. The answerer
#            (Solve) and the scorer (Verify) run on it, with the same commands
#            (`docker build --target coding -t aml-coding .`).
# The base is pinned to Debian 12 (bookworm): the coding target's apt pins are bookworm's, and its
# /usr/bin/python3 (3.11.2) is the interpreter the coding bundles' tests run under (registration,
# `aml dataset add --format coding`, runs them in the same sandbox on a bookworm host).
FROM python:3.11-slim-bookworm AS service

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

# The coding worker. The sandbox binds /usr read-only and masks /usr/local, where this image's own
# Python and the platform live, so the agent's commands and the hidden tests need Debian's
# /usr/bin/python3; `python` and `python3` on PATH stay /usr/local's for the service itself.
# bwrap is Debian's non-setuid build: it creates its namespaces as the unprivileged user 10001,
# which the host must allow (docs/architecture.md, "Deployment of the coding track"). git writes
# the agent's patch and applies patches. What else the sandbox runs (/usr/bin/nice,
# /usr/bin/prlimit, /bin/sh, /bin/bash) is in every Debian image (Essential packages). Versions:
# the bookworm release of each, with its security revisions (`+deb12u*`); a build fails, rather
# than drifting, once Debian moves a package past its pin.
FROM service AS coding
USER root
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        'bubblewrap=0.8.0-2+deb12u*' \
        'git=1:2.39.5-0+deb12u*' \
        'python3=3.11.2-1*' \
        'python3.11=3.11.2-6+deb12u*' \
    && rm -rf /var/lib/apt/lists/*
USER 10001:10001

# The default target (no --target): the service image, unchanged by the coding stage above.
FROM service

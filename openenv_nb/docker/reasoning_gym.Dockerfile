# reasoning-gym's datasets, one question per episode, served by openenv-nb. Build it with `openenv build reasoning_gym`: that stages the context this file expects
# (`.openenv/` holds a wheel of openenv-nb made from the local source, and the requirements of its server and of
# the `reasoning` extra). One image serves the whole family: pick what it serves at run time with OPENENV_TARGET,
# e.g. `docker run -e OPENENV_TARGET='reasoning_gym:sudoku' ...`.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# the server's requirements and the reasoning extra's (reasoning-gym), in a layer of their own: reused until they
# change. reasoning-gym pins pycosat, which PyPI has as source only: a C compiler builds it, and leaves with the layer
COPY .openenv/requirements.txt /opt/openenv/requirements.txt
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && \
    python -m pip install -r /opt/openenv/requirements.txt && \
    apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*

# openenv-nb itself, from the wheel of the local source (its requirements are all installed above)
COPY .openenv/ /opt/openenv/
RUN python -m pip install --no-deps /opt/openenv/*.whl

# the server runs as a user without privileges
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin openenv
USER 10001
WORKDIR /home/openenv

# OPENENV_TOKEN, given at run time (`docker run -e OPENENV_TOKEN=...`, or a Space secret), makes the server ask
# every client for it as a bearer token. The server reads it from its environment, which `exec` hands on: never
# set it here (it would stay in the image) nor pass it as an argument (`ps` and `docker inspect` would show it).

# what to serve, and where to listen: containers sharing the host's network are each given their own PORT
ENV OPENENV_TARGET=reasoning_gym:leg_counting HOST=0.0.0.0 PORT=8000 LOG_LEVEL=info
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % os.environ['PORT'], timeout=2)"]
CMD ["sh", "-c", "exec openenv serve \"$OPENENV_TARGET\" --host \"$HOST\" --port \"$PORT\" ${MAX_SESSIONS:+--max-sessions \"$MAX_SESSIONS\"} --log-level \"$LOG_LEVEL\""]

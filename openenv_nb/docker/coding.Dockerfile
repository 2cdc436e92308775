# The coding environment of openenv-nb. Build it with `openenv build coding`: that stages the context this file
# expects (`.openenv/` holds a wheel of openenv-nb made from the local source and its requirements).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# openenv-nb's dependencies in a layer of their own: reused until they change
COPY .openenv/requirements.txt /opt/openenv/requirements.txt
RUN python -m pip install -r /opt/openenv/requirements.txt

# openenv-nb itself, from the wheel of the local source
COPY .openenv/ /opt/openenv/
RUN python -m pip install --no-deps /opt/openenv/*.whl

# The server runs as a user without privileges. Its sandbox gives each worker a uid of its own all the same, under
# Docker's default seccomp profile and capabilities (no namespaces, no mounts: Landlock and the syscall filter stand
# in for those): the fork server runs on a copy of Python that holds, as file capabilities, what switching and
# cleaning up after workers takes (CAP_CHOWN 0, CAP_DAC_OVERRIDE 1, CAP_KILL 5, CAP_SETGID 6, CAP_SETUID 7: mask
# 0xE3), which Docker's default capability set allows. Only the server's group may run it; each worker drops every
# capability after switching uid. `docker run --security-opt no-new-privileges` turns file capabilities off: the
# workers then share the server's uid, and the seccomp filter and Landlock still keep them apart.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin openenv \
 && chmod 0700 /home/openenv && mkdir -p /opt/openenv/bin \
 && cp "$(python -c 'import os, sys; print(os.path.realpath(sys.executable))')" /opt/openenv/bin/sandbox-python \
 && chown root:openenv /opt/openenv/bin/sandbox-python && chmod 0750 /opt/openenv/bin/sandbox-python \
 && python -c "import os, struct; os.setxattr('/opt/openenv/bin/sandbox-python', 'security.capability', struct.pack('<5I', 0x02000001, 0xE3, 0, 0, 0))"
ENV OPENENV_SANDBOX_PYTHON=/opt/openenv/bin/sandbox-python
USER 10001
WORKDIR /home/openenv

# OPENENV_TOKEN, given at run time (`docker run -e OPENENV_TOKEN=...`, or a Space secret), makes the server ask
# every client for it as a bearer token. The server reads it from its environment, which `exec` hands on: never
# set it here (it would stay in the image) nor pass it as an argument (`ps` and `docker inspect` would show it).

# where to listen: containers sharing the host's network are each given their own PORT. MAX_SESSIONS unset: as many
# sessions as fit the sandbox's memory cap (half of the container's memory, OPENENV_SANDBOX_TOTAL_MEMORY_MB).
ENV HOST=0.0.0.0 PORT=8000 LOG_LEVEL=info
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % os.environ['PORT'], timeout=2)"]
CMD ["sh", "-c", "exec openenv serve coding --host \"$HOST\" --port \"$PORT\" ${MAX_SESSIONS:+--max-sessions \"$MAX_SESSIONS\"} --log-level \"$LOG_LEVEL\""]

# Tandem in one container; README "Deploying" says how to run it.
#   docker build -t tandem .
# Config: /config/config.yaml (mounted read-only) and the environment (secrets);
# data: the SQLite database and the persona's notes in /data; the tools' files in /workspace.
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Tandem from this source tree; bot/_persona links to persona/, the default persona.
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY persona ./persona
COPY adapters ./adapters
COPY bot ./bot
RUN pip install . && cd / && rm -rf /src

# bubblewrap, for `tools.shell.sandbox: bwrap` (the container must be allowed to create
# user namespaces: README "Sandboxed shell")
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 tandem \
 && useradd --system --uid 10001 --gid tandem --create-home --home-dir /home/tandem \
        --shell /usr/sbin/nologin tandem \
 && mkdir -p /config /data /workspace \
 && chown tandem:tandem /data /workspace \
 && chmod 0700 /data

# These win over config.yaml, so the database, the notes and the files stay in volumes.
ENV TANDEM_STORE__PATH=/data/tandem.db \
    TANDEM_PERSONA__DIR=/data/persona \
    TANDEM_WORKSPACE__DIR=/workspace
VOLUME ["/data", "/workspace"]
WORKDIR /config
USER tandem

HEALTHCHECK --interval=1m --timeout=30s --start-period=30s --retries=3 \
    CMD ["tandem", "doctor", "--quick", "--config", "/config/config.yaml"]
ENTRYPOINT ["tandem"]
CMD ["run", "--config", "/config/config.yaml"]

# One image for the API and the workers (CPU). The GPU worker builds FROM a CUDA base with
# the same steps plus `pip install -e .[gpu]` (see docker-compose.yml, worker-gpu).
FROM python:3.11-slim
ARG EXTRAS=""
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY backend backend
COPY pipelines pipelines
COPY frontend frontend
COPY migrations migrations
COPY sample-data sample-data
RUN pip install --no-cache-dir -e ".${EXTRAS}"
# the API and the workers run as lstdp, not root; /data (the product store volume) is its
# own (a new named volume takes this owner from the image)
RUN groupadd --system --gid 10001 lstdp \
    && useradd --system --uid 10001 --gid lstdp --home-dir /app --no-create-home --shell /usr/sbin/nologin lstdp \
    && mkdir -p /data && chown lstdp:lstdp /data
ENV DATA_DIR=/data
VOLUME /data
USER lstdp
EXPOSE 8000
CMD ["lstdp", "serve", "--host", "0.0.0.0", "--port", "8000"]

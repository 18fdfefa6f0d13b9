# memstream worker / tools image (used by docker-compose.yml).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY streams ./streams
COPY schemas ./schemas
RUN pip install --no-cache-dir -e .
ENV MEMSTREAM_DATA_DIR=/data MEMSTREAM_WEB_HOST=0.0.0.0
VOLUME /data
ENTRYPOINT ["memstream"]
CMD ["worker"]

# memstream worker / tools image (used by docker-compose.yml).
# Stage 1 builds memstream's wheel (the schemas and the dashboard page are package data in it).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY streams ./streams
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

# Stage 2 installs the wheel, non-editable, with the exact versions of constraints.txt (the lock);
# no source tree in the image: the package is the installed one (tests/test_wheel.py checks the
# same wheel installed outside the repo).
FROM python:3.11-slim
COPY constraints.txt /tmp/constraints.txt
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir -c /tmp/constraints.txt /tmp/wheels/memstream-*.whl \
    && rm -rf /tmp/wheels /tmp/constraints.txt
WORKDIR /app
ENV MEMSTREAM_DATA_DIR=/data MEMSTREAM_WEB_HOST=0.0.0.0
VOLUME /data
ENTRYPOINT ["memstream"]
CMD ["worker"]

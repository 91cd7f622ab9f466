# The pipeline worker image (also runs `pipeline topics create` in docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# torch from PyPI is a CUDA build of several GB; the CPU wheel is enough for a
# CPU worker. Build with --build-arg TORCH_INDEX=https://pypi.org/simple for CUDA.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /app
COPY constraints.txt /app/
# The pinned torch version (constraints.txt); a CPU build matches it as 2.x.y+cpu.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" -c constraints.txt torch
COPY . /app
# Editable on purpose: the package reads schemas/ (and ops/) next to itself.
RUN pip install --no-cache-dir -c constraints.txt -e .

EXPOSE 6066
CMD ["faust", "-A", "pipeline.app", "worker", "-l", "info"]

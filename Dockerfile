# One image for every role of a mixflow job: source loaders (`mixflow load`), the data constructor
# (`mixflow construct`), the trainer (torch, CPU build) and the example data builder.
#
#   docker build -t mixflow .
#   docker run --rm mixflow spec check examples/example.yaml
#
# docker-compose.yml runs the example job with it; tests/test_compose.py keeps the two in line with the code.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# torch from PyPI is a CUDA build of a few GB; the CPU build keeps the image small. It comes first so
# that nothing later pulls the CUDA build, and in its own layer so that code changes do not fetch it again.
RUN pip install torch --index-url https://download.pytorch.org/whl/cpu

WORKDIR /app

# The dependencies alone, from pyproject.toml, so that a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c "import subprocess, sys, tomllib; \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', *deps])"

# The package itself (the packages pyproject.toml's [tool.setuptools] finds), then the example job.
COPY pipeline/ pipeline/
COPY topics/ topics/
COPY connectors/ connectors/
COPY trainer_sink/ trainer_sink/
# The planning kernels compiled into the installed package's cache, so that no role compiles them at start.
RUN pip install . && rm -rf build ./*.egg-info && mixflow --help >/dev/null && python -m pipeline.planning.warm
COPY examples/ examples/

# Roles run unprivileged. The folders that compose mounts volumes on belong to that user, so the
# volumes start out writable by it; examples/data is where examples/example.yaml finds its sources.
RUN useradd --create-home --uid 1000 mixflow \
    && mkdir -p /data /out /app/examples/data \
    && chown mixflow:mixflow /data /out /app/examples/data
USER 1000:1000

ENTRYPOINT ["mixflow"]
CMD ["--help"]

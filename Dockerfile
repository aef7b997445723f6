# The Airflow image of docker-compose.yaml: the official Airflow 3.3 image plus the trainops wheels
# (airflow-provider-trainops, trainops-core, and trainops-devcluster for the playground's simulated
# cluster and demo trainer). Build the wheels first: `make wheels` writes them to dist/.
FROM apache/airflow:3.3.2

# The devcluster runs Debian's Prometheus next to it, scraping the simulated nodes' dcgm-exporter.
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
USER airflow

COPY --chown=airflow:root dist/*.whl /tmp/trainops-wheels/
# Pin Airflow to the image's version so installing the provider never up- or downgrades it.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" /tmp/trainops-wheels/*.whl \
    && rm -rf /tmp/trainops-wheels

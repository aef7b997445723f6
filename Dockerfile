# The Airflow image of docker-compose.yaml: the official Airflow 3.3 image plus the trainops wheels
# (airflow-provider-trainops, trainops-core, and trainops-devcluster for the playground's simulated
# cluster and demo trainer). Build the wheels first: `make wheels` writes them to dist/.
FROM apache/airflow:3.3.2

COPY --chown=airflow:root dist/*.whl /tmp/trainops-wheels/
# Pin Airflow to the image's version so installing the provider never up- or downgrades it.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" /tmp/trainops-wheels/*.whl \
    && rm -rf /tmp/trainops-wheels

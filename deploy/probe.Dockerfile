# The node probe image that deploy/node-probe.yaml runs on every GPU node: a slim Python with only
# trainops-core installed (the Airflow-free half of trainops, no Airflow), running `trainops probe`
# as a non-root user.  Build it from the repository root after `make wheels`, then push it where
# your nodes pull from (and change the image in node-probe.yaml to match):
#   make wheels
#   docker build -f deploy/probe.Dockerfile -t registry.example/trainops-probe:0.1.0 .
#   docker push registry.example/trainops-probe:0.1.0
FROM python:3.11-slim-bookworm

COPY dist/trainops_core-*.whl /tmp/wheels/
RUN pip install --no-cache-dir --root-user-action=ignore /tmp/wheels/trainops_core-*.whl \
    && rm -rf /tmp/wheels

ENV PYTHONUNBUFFERED=1
# nobody:nogroup, numeric so that the kubelet can enforce runAsNonRoot.
USER 65534:65534
ENTRYPOINT ["trainops", "probe"]
CMD ["--publish"]

"""trainops: the life of a large GPU training run on Kubernetes, driven from Airflow.

The ``trainops`` core (health, checkpoints, cluster, devcluster) never imports Airflow, so the
node probe and the training-side checkpoint helper run in small images.  Airflow-facing classes
live in ``trainops.hooks``, ``trainops.operators``, ``trainops.sensors`` and ``trainops.triggers``.
"""

__version__ = "0.1.0"

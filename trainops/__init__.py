"""trainops: the life of a large GPU training run on Kubernetes, driven from Airflow.

Two source trees install as this one package, from two distributions:

- ``trainops/`` (this folder) is ``trainops-core`` (``core/pyproject.toml``; ``core/trainops`` links here):
  the Airflow-free core — health, checkpoints, capacity, training, the Kubernetes facade ``trainops.kube``,
  the CLI.  It never imports Airflow, so the node probe and the training-side checkpoint helper run in
  small images.
- the repository's ``hooks/``, ``operators/``, ``sensors/``, ``triggers/``, ``provider/`` and ``plugins/``
  are ``airflow-provider-trainops`` (``setup.py`` maps each folder to ``trainops.<folder>``): the Airflow
  classes, thin over the core.  In this checkout they import as ``trainops.operators`` and so on, not
  by their folder names.

The provider depends on the core; the core never imports the provider, and neither imports the
simulated cluster (``trainops_devcluster``).
"""

__version__ = "0.1.0"

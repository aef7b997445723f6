"""``trainops doctor``: reads a cluster and answers, check by check, whether trainops will work on it:
ok, or each problem and its fix.  Read-only (GETs, LISTs, discovery and SelfSubjectAccessReviews),
every check under a deadline of its own.

    report = run_doctor(Kube.from_kubeconfig(path), DoctorConfig(prometheus=PrometheusClient(url)))
    print(report.text()); sys.exit(report.exit_code)

One module per check group: ``gpu_operator``, ``node_probe``, ``dcgm``, ``kueue``, ``tolerations``,
``namespaces``, ``admission``, ``access`` (the package's permissions, ``trainops.permissions``);
``checks.CHECKS`` lists them, ``runner`` runs them, ``config`` holds what they are given
(``DoctorConfig``) and what a check is (``Check``), ``result`` what they answer.
"""

from trainops.doctor.config import DoctorConfig
from trainops.doctor.result import Finding, Problem, Report
from trainops.doctor.runner import ClusterUnreachable, run_doctor

__all__ = ["ClusterUnreachable", "DoctorConfig", "Finding", "Problem", "Report", "run_doctor"]

"""The package's own permissions: for every verb trainops uses as the chosen account
(``trainops.permissions``, the table deploy/rbac.yaml grants), a SelfSubjectAccessReview asks the
API server whether the caller may.  Run the doctor with that account's credentials (the preflight
task does: it runs as the worker)."""

from __future__ import annotations

from trainops.doctor.reads import Reads
from trainops.doctor.result import Outcome, Problem
from trainops.permissions import permissions_of


def check(reads: Reads, config) -> Outcome:
    needed = permissions_of(config.account)
    problems = []
    for permission in needed:
        namespace = permission.where(config.training_namespace)
        allowed = reads.access(permission.verb, permission.group, permission.resource, namespace)
        if not allowed:
            where = f"in namespace {namespace}" if namespace else "cluster-wide"
            problems.append(
                Problem(
                    f"this account may not {permission.verb} {permission.resource}"
                    + (f".{permission.group}" if permission.group else "")
                    + f" {where} ({permission.why})",
                    f"kubectl apply -f deploy/rbac.yaml, with its subjects renamed to the {config.account}'s "
                    "ServiceAccount (or run the doctor with that account's credentials)",
                )
            )
    return Outcome(
        f"{len(needed) - len(problems)} of {len(needed)} permissions the {config.account} uses are granted",
        problems,
    )

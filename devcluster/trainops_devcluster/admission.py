"""kube-apiserver's validating admission, run on every write before it is stored: what the request is
(``Attributes``) and the chain (``ValidatingAdmission``): Pod Security (``pod_security.py``), then the
stored ValidatingAdmissionPolicies (``admission_policy.py``).

The API server runs it for the writes it serves; the devcluster's controllers, which write the store
directly, run it for the pods they create, as their requests would meet it on a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainops_devcluster.admission_policy import Policies
from trainops_devcluster.authn import User
from trainops_devcluster.kinds import Kind
from trainops_devcluster.pod_security import PodSecurity
from trainops_devcluster.store import Store


@dataclass(frozen=True)
class Attributes:
    """One admission request (``admission.Attributes``): who does what to which object."""

    user: User
    operation: str  # CREATE, UPDATE, DELETE
    kind: Kind  # the resource's kind (Pod for pods/eviction)
    sub: str
    namespace: str
    name: str
    obj: dict | None
    old: dict | None
    dry_run: bool = False
    options: dict = field(default_factory=dict)


class ValidatingAdmission:
    """The validating admission plugins, in kube-apiserver's order."""

    def __init__(self, store: Store) -> None:
        self.plugins = [PodSecurity(store), Policies(store)]

    def validate(self, attrs: Attributes) -> list[str]:
        """Raise the first plugin's denial; return the warnings for the response."""
        return [warning for plugin in self.plugins for warning in plugin.validate(attrs)]

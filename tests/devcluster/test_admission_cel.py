"""The devcluster's ValidatingAdmissionPolicy machinery against what kube-apiserver does: CEL on
cel-python with Kubernetes' string extension and cel-go's error texts, the ``request`` variable as
kube-apiserver builds it, policy matching, failure policies and the type check."""

from __future__ import annotations

import copy

import pytest
from trainops_devcluster import admission_policy, cel, kinds
from trainops_devcluster.admission import Attributes
from trainops_devcluster.authn import NODE_NAME, service_account_user
from trainops_devcluster.errors import AdmissionDenied, Invalid
from trainops_devcluster.store import Store

NODES, CONFIGMAPS = kinds.by_resource("nodes"), kinds.by_resource("configmaps")
PROBE = service_account_user("kube-system", "probe", {NODE_NAME: ["n1"]})
NODE = {"metadata": {"name": "n1", "labels": {"a": "1"}}, "spec": {"taints": []}, "status": {"capacity": {}}}


def evaluate(expression: str, **values):
    program = cel.compile_expression(expression, admission_policy.NAMES)
    return cel.from_cel(
        program.evaluate({name: cel.to_cel(values.get(name)) for name in admission_policy.NAMES})
    )


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("'node-health-n1'.substring(0, 4)", "node"),
        ("'node-health-n1'.substring(12)", "n1"),
        ("'a.b.c'.indexOf('.')", 1),
        ("'a.b.c'.indexOf('.', 2)", 3),
        ("'a.b.c'.lastIndexOf('.')", 3),
        ("'a,b,c'.split(',')", ["a", "b", "c"]),
        ("'a,b,c'.split(',', 2)", ["a", "b,c"]),
        ("['a', 'b'].join('-')", "a-b"),
        ("'MiXed'.lowerAscii() + 'MiXed'.upperAscii()", "mixedMIXED"),
        ("'  x '.trim()", "x"),
        ("'aaa'.replace('a', 'b', 2)", "bba"),
        ("'abc'.charAt(1)", "b"),
        ("'gpu-node-000'.matches('^gpu-node-[0-9]+$')", True),
        ("{'a': 1}.all(k, k == 'a') && [1, 2].exists(x, x == 2)", True),
        ("has(request.subResource)", False),
        ("dyn(object.metadata).all(k, k in ['name', 'labels'])", True),
    ],
)
def test_cel_with_kubernetes_string_extension(expression, expected):
    assert evaluate(expression, request={"operation": "UPDATE"}, object=NODE) == expected


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("request.subResource == 'status'", "no such key: subResource"),
        ("'abc'.substring(5)", "index out of range: 5"),
        ("'abc'.substring(2, 1)", "invalid substring range. start: 2, end: 1"),
        # an error in a condition is the result (celpy would report a missing overload)
        ("request.userInfo.extra['x'] == [] ? 'a' : 'b'", "no such key: extra"),
    ],
)
def test_cel_errors_read_as_cel_gos(expression, error):
    with pytest.raises(cel.CelError) as raised:
        evaluate(expression, request={"userInfo": {"username": "u"}})
    assert str(raised.value) == error


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        (
            "objekt.spec",
            "ERROR: <input>:1:1: undeclared reference to 'objekt' (in container '')\n | objekt.spec\n | ^",
        ),
        ("object.metadata.labels.isSorted()", "undeclared reference to 'isSorted'"),
        ("request.subresource == 'status'", "ERROR: <input>:1:8: undefined field 'subresource'"),
        ("request.userInfo.name", "undefined field 'name'"),
        ("1 +", "Syntax error"),
    ],
)
def test_an_expression_kube_apiserver_would_not_compile_is_refused_with_the_policy(expression, error):
    policy = _policy([{"expression": expression}])
    with pytest.raises(Invalid) as refused:
        admission_policy.compile_policy(policy)
    assert refused.value.causes[0][0] == "spec.validations[0].expression"
    assert error in refused.value.causes[0][2] and "compilation failed: " in refused.value.causes[0][2]


def _policy(
    validations, *, resources=("nodes", "nodes/status", "configmaps"), failure="Fail", **spec
) -> dict:
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": list(resources)}]
    body = {
        "failurePolicy": failure,
        "matchConstraints": {"resourceRules": rules},
        "validations": validations,
    }
    return {"metadata": {"name": "p", "uid": "u", "resourceVersion": "1"}, "spec": {**body, **spec}}


def _store(policy: dict, actions=("Deny",), **binding) -> Store:
    store = Store()
    store.create(admission_policy.POLICIES, policy)
    spec = {"policyName": "p", "validationActions": list(actions), **binding}
    store.create(admission_policy.BINDINGS, {"metadata": {"name": "b"}, "spec": spec})
    return store


def _update(kind=NODES, sub="", obj=None, old=None, user=PROBE, namespace="") -> Attributes:
    obj = obj or copy.deepcopy(NODE)
    return Attributes(
        user, "UPDATE", kind, sub, namespace, obj["metadata"]["name"], obj, old or copy.deepcopy(NODE)
    )


# the policy as it was before it was written against the request kube-apiserver builds
NAIVE = (
    "request.resource.resource != 'nodes' || request.subResource == 'status' || object.spec == oldObject.spec"
)


def test_a_rule_that_errors_on_kube_apiserver_errors_here_and_its_failure_policy_decides():
    tainted = copy.deepcopy(NODE)
    tainted["spec"]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    validation = {"expression": NAIVE, "message": "the probe may not change a node's spec"}
    with pytest.raises(AdmissionDenied) as denied:
        admission_policy.Policies(_store(_policy([validation]))).validate(_update(obj=tainted))
    assert str(denied.value) == (
        "nodes \"n1\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: "
        f"expression '{NAIVE}' resulted in error: no such key: subResource"
    )  # refused for the error, not by its own message, and for any change at all (failurePolicy: Fail)
    lenient = _store(_policy([validation], failure="Ignore"))
    assert admission_policy.Policies(lenient).validate(_update(obj=tainted)) == []  # Ignore: admitted


def test_the_type_check_warns_of_fields_a_matched_kind_lacks():
    warnings = admission_policy.type_warnings(_policy([{"expression": NAIVE}]))
    assert warnings == [
        {
            "fieldRef": "spec.validations[0].expression",
            "warning": "/v1, Kind=ConfigMap: ERROR: <input>:1:82: undefined field 'spec'\n"
            f" | {NAIVE}\n | {'.' * 81}^\n"
            f"ERROR: <input>:1:100: undefined field 'spec'\n | {NAIVE}\n | {'.' * 99}^\n",
        }
    ]
    assert admission_policy.type_warnings(_policy([{"expression": NAIVE}], resources=["nodes"])) == []


@pytest.mark.parametrize(
    ("resources", "kind", "sub", "matched"),
    [
        (["nodes"], NODES, "", True),
        (["nodes"], NODES, "status", False),
        (["nodes/status"], NODES, "status", True),
        (["nodes/*"], NODES, "status", True),
        (["nodes/*"], NODES, "", True),  # rules.go: "*" matches any subresource, none included
        (["*"], CONFIGMAPS, "", True),
        (["*/status"], NODES, "status", True),
        (["configmaps"], NODES, "", False),
    ],
)
def test_resource_rules_match_resources_and_subresources_as_kube_apiserver_does(
    resources, kind, sub, matched
):
    store = _store(_policy([{"expression": "false", "message": "no"}], resources=resources))
    obj = {"metadata": {"name": "n1"}}
    attrs = Attributes(PROBE, "UPDATE", kind, sub, "default" if kind.namespaced else "", "n1", obj, obj)
    if matched:
        with pytest.raises(AdmissionDenied):
            admission_policy.Policies(store).validate(attrs)
    else:
        assert admission_policy.Policies(store).validate(attrs) == []


def test_match_conditions_variables_message_expression_warn_and_reason():
    policy = _policy(
        [
            {
                "expression": "object.metadata.name != variables.own",
                "messageExpression": "'node ' + variables.own + ' is mine'",
                "reason": "Forbidden",
            }
        ],
        matchConditions=[{"name": "probe", "expression": "request.userInfo.username.endsWith(':probe')"}],
        variables=[{"name": "own", "expression": "request.userInfo.extra['" + NODE_NAME + "'][0]"}],
    )
    with pytest.raises(AdmissionDenied) as denied:
        admission_policy.Policies(_store(policy)).validate(_update())
    assert (denied.value.code, denied.value.reason) == (403, "Forbidden")
    assert str(denied.value).endswith("denied request: node n1 is mine")
    admin = service_account_user("kube-system", "other")
    assert admission_policy.Policies(_store(policy)).validate(_update(user=admin)) == []  # not matched
    warned = admission_policy.Policies(_store(policy, actions=("Warn",))).validate(_update())
    assert warned == ["Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': node n1 is mine"]


def test_the_request_variable_leaves_out_what_is_empty_as_go_serializes_it():
    request = admission_policy.admission_request(_update())
    assert "subResource" not in request and "namespace" not in request and request["uid"] == ""
    assert request["resource"] == {"group": "", "version": "v1", "resource": "nodes"}
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Node"}
    assert request["userInfo"]["extra"] == {NODE_NAME: ["n1"]} and request["dryRun"] is False
    status = admission_policy.admission_request(_update(sub="status"))
    assert status["subResource"] == status["requestSubResource"] == "status"

"""The devcluster's HTTP API server: a kube-apiserver for everything trainops and stock clients use.

Routing, discovery and OpenAPI, list/watch with selectors and pagination, create/update/patch/
delete with preconditions, status and scale subresources, eviction with PodDisruptionBudgets,
pod logs, admission, audit and injected faults.  Objects live in the ``Store``; what a real
cluster's controllers do is done by the controllers of the devcluster, not here.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import json
import logging
import queue
import select
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from trainops_devcluster import (
    admission_policy,
    apply,
    authn,
    defaults,
    gc,
    kinds,
    openapi,
    patch,
    pdb,
    protobuf,
    rbac,
    tables,
    tls,
)
from trainops_devcluster.admission import Attributes, ValidatingAdmission
from trainops_devcluster.audit import ApiFaults, AuditLog
from trainops_devcluster.authn import User
from trainops_devcluster.errors import (
    BadRequest,
    Forbidden,
    InternalError,
    Invalid,
    MethodNotAllowed,
    ServiceUnavailable,
    TooManyRequests,
    UnsupportedMediaType,
    status,
)
from trainops_devcluster.kinds import Kind
from trainops_devcluster.logs import PodLogs
from trainops_devcluster.selectors import field_selector, label_selector
from trainops_devcluster.store import (
    ADDED,
    DELETED,
    MODIFIED,
    Conflict,
    Event,
    Gone,
    NotFound,
    Store,
    StoreError,
)
from trainops_devcluster.validation import validate, validate_update

log = logging.getLogger(__name__)

Admission = Callable[[str, str, dict, "dict | None"], dict]
Extension = Callable[[str, str, dict, bytes], tuple[int, str, bytes]]

JSON = "application/json"
_SCALE = Kind("autoscaling", "v1", "Scale", "scale", True, schema="io.k8s.api.autoscaling.v1.Scale")
_NOT_FOUND = "the server could not find the requested resource"


@dataclass
class _Call:
    """One resource request, routed."""

    method: str
    kind: Kind
    namespace: str | None  # None: all namespaces (a list or watch of a namespaced kind)
    name: str
    sub: str
    query: dict[str, str]
    body: bytes
    handler: BaseHTTPRequestHandler
    user: User

    @property
    def ns(self) -> str:
        return self.namespace or ""

    @property
    def dry_run(self) -> bool:
        return self.query.get("dryRun") == "All"


class ApiServer:
    """Serve ``store`` over HTTP; ``start()`` returns the base URL."""

    #: seconds between BOOKMARK events on an idle watch that asked for them
    bookmark_interval = 5.0
    #: seconds a write waits, before it is applied, for its connection to close (see ``_cancel_if_gone``)
    cancel_window_s = 0.0

    def __init__(
        self,
        store: Store,
        *,
        logs: PodLogs,
        host: str = "127.0.0.1",
        port: int = 0,
        admission: Iterable[Admission] = (),
        extension: Extension | None = None,
        kueue_version: str | None = kinds.KUEUE_VERSIONS[0],
    ) -> None:
        self.store, self.logs = store, logs
        self.served = kinds.served(kueue_version)
        self.host, self.port = host, port
        self.admission = list(admission)
        self.extension = extension
        self.audit = AuditLog()
        self.faults = ApiFaults()
        self.tokens = authn.Tokens(store)
        self.authorizer = rbac.Authorizer(store)
        self.validating = ValidatingAdmission(store)
        self.url = self.secure_url = ""
        self.serving_cert = tls.ServingCert.self_signed()
        self._servers: list[_HttpServer] = []
        self._stopping = threading.Event()

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> str:
        """Serve HTTP on ``port`` (``url``) and HTTPS on another free port (``secure_url``, with
        ``serving_cert``): the same API, for clients that send credentials only over TLS."""
        httpd = self._serve_on(self.port, None)
        self.url = f"http://{self.host}:{httpd.server_address[1]}"
        secure = self._serve_on(0, self.serving_cert.server_context())
        self.secure_url = f"https://{self.host}:{secure.server_address[1]}"
        return self.url

    def _serve_on(self, port: int, context: ssl.SSLContext | None) -> _HttpServer:
        httpd = _HttpServer((self.host, port), _Handler)
        if context is not None:  # the handshake happens in the request's thread (_Handler.setup)
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
        httpd.api = self  # type: ignore[attr-defined]
        self._servers.append(httpd)
        threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="ApiServer", daemon=True
        ).start()
        return httpd

    def stop(self) -> None:
        self._stopping.set()
        for httpd in self._servers:
            httpd.shutdown()
            httpd.server_close()
        self.store.close_all_watches()

    def drop_watches(self) -> int:
        """End every open watch stream (clients see the connection end and re-watch)."""
        return self.store.close_all_watches()

    # ---- request entry -----------------------------------------------------------------
    def serve(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        path = split.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        attrs = rbac.attributes(h.command, path, query)
        user: User | None = None
        recorded = False

        def record(code: int) -> None:
            """Audit the request when its status line is written, before the client can see it."""
            nonlocal recorded
            if not recorded:
                recorded = True
                user_agent = h.headers.get("User-Agent", "")
                self.audit.record(
                    verb=attrs.verb,
                    method=h.command,
                    path=h.path,
                    status=code,
                    user_agent=user_agent,
                    user=user.name if user else "",
                )

        h.on_status = record  # type: ignore[attr-defined]
        code = 500
        try:
            body = _read_body(h)
            _cancel_if_gone(h, 0.0)
            user = self.tokens.authenticate(h.headers.get("Authorization"))  # 401
            self._authorize(user, attrs)  # 403
            if h.headers.get("Content-Type", "").startswith(protobuf.MEDIA_TYPE):
                body = _from_protobuf(body)
            if path.startswith("/devcluster/") and self.extension:
                code, ctype, payload = self.extension(h.command, path, query, body)
                code = _send(h, code, payload, ctype)
                return
            injected = self.faults.pick(h.path)
            if injected:
                code = self._send_error(h, _injected(injected, h.path))
                return
            code = self._route(h, path, query, body, user)
        except Cancelled:
            code, h.close_connection = 504, True
        except StoreError as error:
            code = self._send_error(h, error)
        except (BrokenPipeError, ConnectionResetError):
            code = 499
        except Exception as exc:  # a bug answers 500; the server keeps serving
            log.exception("request %s %s failed", h.command, h.path)
            code = self._send_error(h, InternalError(f"Internal error occurred: {exc}"))
        finally:
            record(code)

    def _authorize(self, user: User, attrs: rbac.Attributes) -> None:
        """403 unless RBAC allows ``user`` the request, before anything else looks at it."""
        if self.authorizer.allowed_by(user, attrs) is None:
            raise rbac.forbidden(user, attrs)

    def _send_error(self, h: BaseHTTPRequestHandler, error: StoreError) -> int:
        headers = None
        if isinstance(error, TooManyRequests) and error.retry_after:
            headers = {"Retry-After": str(error.retry_after)}
        try:
            return _send(h, error.code, _dumps(status(error)), JSON, headers)
        except (BrokenPipeError, ConnectionResetError):
            return error.code

    # ---- routing -----------------------------------------------------------------------
    def _route(self, h: BaseHTTPRequestHandler, path: str, query: dict, body: bytes, user: User) -> int:
        if h.command == "GET":
            static = self._static(path)
            if static is not None:
                return _send(h, 200, static)
        if h.command == "POST" and path == rbac.REVIEW_PATH:
            review = rbac.self_subject_access_review(self.authorizer, user, _json_body(body))
            return _send(h, 201, _dumps(review))
        call = _resource_call(self.served, h, path, query, body, user)
        if call is None:
            raise NotFound(_NOT_FOUND)
        return self._resource(call)

    def _static(self, path: str) -> bytes | None:
        if path in ("/healthz", "/readyz", "/livez"):
            return b"ok"
        if path == "/version":
            return _dumps(kinds.version_info())
        if path == "/api":
            return _dumps(kinds.core_versions())
        if path == "/apis":
            return _dumps(self.served.api_group_list())
        if path == "/openapi/v3":
            return openapi.v3_root(self.served)
        if path.startswith("/openapi/v3/"):
            return openapi.v3_document(path[len("/openapi/v3/") :], self.served)
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) == 2:
            found = self.served.resource_list("", parts[1])
        elif parts[0] == "apis" and len(parts) == 2:
            found = self.served.api_group(parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            found = self.served.resource_list(parts[1], parts[2])
        else:
            found = None
        return _dumps(found) if found else None
        return None

    def _resource(self, call: _Call) -> int:
        k, method = call.kind, call.method
        if call.sub and call.sub not in k.subresources:
            raise NotFound(_NOT_FOUND)
        if not call.name:
            if method == "GET":
                return self._watch(call) if _flag(call.query, "watch") else self._list(call)
            if method == "POST":
                return self._create(call)
            if method == "DELETE":
                return self._delete_collection(call)
            raise MethodNotAllowed(
                "the server does not allow this method on the requested resource", resource=k.resource
            )
        handlers = {
            ("GET", ""): self._get,
            ("GET", "status"): self._get,
            ("GET", "scale"): self._get_scale,
            ("GET", "log"): self._log,
            ("POST", "eviction"): self._evict,
            ("POST", "binding"): self._bind,
            ("POST", "token"): self._token_request,
            ("PUT", ""): self._update,
            ("PUT", "status"): self._update,
            ("PUT", "scale"): self._update,
            ("PATCH", ""): self._patch,
            ("PATCH", "status"): self._patch,
            ("PATCH", "scale"): self._patch,
            ("DELETE", ""): self._delete,
        }
        handler = handlers.get((method, call.sub))
        if handler is None:
            raise MethodNotAllowed(
                "the server does not allow this method on the requested resource", resource=k.resource
            )
        return handler(call)

    # ---- reads -------------------------------------------------------------------------
    def _get(self, call: _Call) -> int:
        obj = self.store.get(call.kind.resource, call.ns, call.name)
        if _wants_table(call):
            return _send(call.handler, 200, _dumps(self._table(call, [obj], {"resourceVersion": ""})))
        return _send(call.handler, 200, _dumps(_out(call.kind, obj)))

    def _list(self, call: _Call) -> int:
        k, q = call.kind, call.query
        selects = _selectors(q, k.resource)
        limit = _int_param(q, "limit", 0)
        list_rv, start_key = self._decode_continue(q["continue"]) if q.get("continue") else (None, None)
        items, current_rv = self.store.list(k.resource, call.namespace, after=start_key)
        list_rv = list_rv or current_rv
        page: list[dict] = []
        more_after: int | None = None
        for index in range(len(items)):
            obj = items[index]
            if selects and not all(s(obj) for s in selects):
                continue
            if limit and len(page) == limit:
                more_after = index
                break
            page.append(obj)
        meta: dict = {"resourceVersion": str(list_rv)}
        if more_after is not None:
            meta["continue"] = _encode_continue(list_rv, _key(page[-1]))
            if not selects:
                meta["remainingItemCount"] = len(items) - more_after
        if _wants_table(call):
            return _send(call.handler, 200, _dumps(self._table(call, page, meta)))
        head = _dumps({"kind": f"{k.kind}List", "apiVersion": k.api_version, "metadata": meta})[:-1]
        body = head + b',"items":[' + b",".join(_dumps(_out(k, o)) for o in page) + b"]}"
        return _send(call.handler, 200, body)

    def _decode_continue(self, token: str) -> tuple[int, tuple[str, str]]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, start = int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
        except (ValueError, KeyError, TypeError, IndexError, binascii.Error):
            raise BadRequest(f"continue key is not valid: {token!r}") from None
        if rv < self.store.oldest_resource_version:
            raise Gone(
                "The provided continue parameter is too old to display a consistent list result. You can start a "
                "new list without the continue parameter, or use the continue token in this response to retrieve "
                "the remainder of the results. Continuing with the provided token results in an inconsistent list "
                "- objects that were created, modified, or deleted between the time the first chunk was returned "
                "and now may show up in the list."
            )
        return rv, start

    def _table(self, call: _Call, objs: list[dict], meta: dict, *, with_columns: bool = True) -> dict:
        columns, cells = tables.columns_and_cells(call.kind)
        include = call.query.get("includeObject", "Metadata")
        table = {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "columnDefinitions": columns if with_columns else None,
            "rows": [tables.row(_out(call.kind, o), cells, include) for o in objs],
        }
        return table

    # ---- watch -------------------------------------------------------------------------
    def _watch(self, call: _Call) -> int:
        k, q, h = call.kind, call.query, call.handler
        selects = _selectors(q, k.resource)
        rv_param = q.get("resourceVersion", "")
        since = _int_param(q, "resourceVersion", 0) if rv_param not in ("", "0") else None
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        bookmarks = _flag(q, "allowWatchBookmarks")
        table = _wants_table(call)
        last_rv = self.store.resource_version
        try:
            watch = self.store.watch(k.resource, call.namespace, since)
        except Gone as gone:
            _start_stream(h)
            _chunk(h, _dumps({"type": "ERROR", "object": status(gone)}) + b"\n")
            _end_stream(h)
            return 200
        if since:
            last_rv = since
        _start_stream(h)
        matched: dict[tuple[str, str], bool] = {}  # selector watches: does the client hold the object?
        deadline = time.monotonic() + timeout if timeout else None
        idle_since = time.monotonic()
        first = True
        try:
            while not watch.closed.is_set() and not self._stopping.is_set():
                wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if wait <= 0:
                    break
                try:
                    event = watch.events.get(timeout=wait)
                except queue.Empty:
                    event = False
                if event is None:
                    break
                if event is False:
                    if _client_gone(h):
                        break
                    if bookmarks and time.monotonic() - idle_since >= self.bookmark_interval:
                        mark = {
                            "kind": k.kind,
                            "apiVersion": k.api_version,
                            "metadata": {"resourceVersion": str(last_rv)},
                        }
                        _chunk(h, _dumps({"type": "BOOKMARK", "object": mark}) + b"\n")
                        idle_since = time.monotonic()
                    continue
                kind_of_event = _selected_event(event, selects, matched)
                last_rv = event.resource_version
                if kind_of_event is None:
                    continue
                obj = _out(k, event.object)
                if table:
                    obj = self._table(
                        call, [event.object], {"resourceVersion": str(last_rv)}, with_columns=first
                    )
                first = False
                _chunk(h, _dumps({"type": kind_of_event, "object": obj}) + b"\n")
                idle_since = time.monotonic()
            _end_stream(h)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            self.store.stop_watch(watch)
        return 200

    # ---- writes ------------------------------------------------------------------------
    def _decode(self, call: _Call, kind: Kind | None = None) -> dict:
        kind = kind or call.kind
        obj = _json_body(call.body or b"null")
        # gvkWithDefaults: a missing kind or apiVersion is the URL's, as kube-apiserver decodes it
        obj["kind"] = obj.get("kind") or kind.kind
        obj["apiVersion"] = obj.get("apiVersion") or kind.api_version
        if obj["apiVersion"] != kind.api_version:
            raise BadRequest(
                f"the API version in the data ({obj.get('apiVersion')}) does not match the expected API version "
                f"({kind.api_version})"
            )
        if obj["kind"] != kind.kind:
            raise BadRequest(
                f"the kind in the data ({obj['kind']}) does not match the expected kind ({kind.kind})"
            )
        if not isinstance(obj.setdefault("metadata", {}), dict):
            raise BadRequest("metadata: the object's metadata must be a JSON object")
        return obj

    def _admit(
        self, call: _Call, operation: str, obj: dict | None, old: dict | None
    ) -> tuple[dict | None, list[str]]:
        """Admission, as kube-apiserver runs it right before a write is stored: the mutating webhooks
        (Kueue's), then validating admission (Pod Security, ValidatingAdmissionPolicies); returns the
        object to store and the warnings.  A request whose client has gone is cancelled here."""
        _cancel_if_gone(call.handler, self.cancel_window_s)
        if obj is not None and call.sub != "eviction":
            for admit in self.admission:
                obj = admit(call.kind.resource, operation, obj, old)
        meta = (obj or {}).get("metadata") or {}
        if operation == "CREATE" and not meta.get("name") and meta.get("generateName"):
            # named after mutating admission (a refusal there names the generateName) and before
            # validating admission, as kube-apiserver's BeforeCreate does
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = call.name or ((obj or old or {}).get("metadata") or {}).get("name", "")
        options = {"kind": f"{operation.title()}Options", "apiVersion": "meta.k8s.io/v1"}
        if call.query.get("fieldManager"):
            options["fieldManager"] = call.query["fieldManager"]
        if call.dry_run:
            options["dryRun"] = ["All"]
        request = Attributes(
            call.user, operation, call.kind, call.sub, call.ns, name, obj, old, call.dry_run, options
        )
        return obj, self.validating.validate(request)

    def _check_namespace(self, call: _Call, name: str) -> None:
        ns = self.store.get("namespaces", "", call.ns)
        if ns["metadata"].get("deletionTimestamp"):
            raise Forbidden(
                f'{call.kind.resource} "{name}" is forbidden: unable to create new content in namespace '
                f"{call.ns} because it is being terminated",
                resource=call.kind.resource,
                name=name,
            )

    def _create(self, call: _Call) -> int:
        apply.check_options(call.query, applying=False)
        obj = self._decode(call)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise BadRequest("resourceVersion should not be set on objects to be created")
        meta.pop("managedFields", None)
        return self._store_new(call, obj, _manager(call))

    def _store_new(self, call: _Call, obj: dict, manager: str | None) -> int:
        """Create ``obj`` as a POST (or an apply that finds nothing) does; ``manager`` (an Update)
        owns every field set, unless ``None`` (an apply recorded its own)."""
        k = call.kind
        meta = obj["metadata"]
        if k.namespaced:
            if meta.get("namespace") and meta["namespace"] != call.ns:
                raise BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = call.ns
            self._check_namespace(call, meta.get("name", ""))
        else:
            meta.pop("namespace", None)
        for field in (
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
            "selfLink",
        ):
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        _reset_status(k, obj)
        defaults.apply(k, obj, creating=True)
        if manager is not None:
            apply.record_update(k, None, obj, manager)
        warnings = validate(k, obj, field_validation=call.query.get("fieldValidation", ""))
        admission_policy.prepare(k, obj)
        obj, admitted = self._admit(call, "CREATE", obj, None)
        warnings += admitted
        if call.dry_run:
            return _send(call.handler, 201, _dumps(_out(k, obj)), headers=_warning_headers(warnings))
        created = self.store.create(k.resource, obj)
        return _send(call.handler, 201, _dumps(_out(k, created)), headers=_warning_headers(warnings))

    def _update(self, call: _Call) -> int:
        apply.check_options(call.query, applying=False)
        k = call.kind
        new = self._decode(call, _SCALE if call.sub == "scale" else k)
        meta = new["metadata"]
        if meta.get("name") and meta["name"] != call.name:
            raise BadRequest(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({call.name})"
            )
        if k.namespaced and meta.get("namespace") and meta["namespace"] != call.ns:
            raise BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        current = self.store.get(k.resource, call.ns, call.name)
        if k.custom and not meta.get("resourceVersion"):
            raise Invalid(
                k.kind,
                call.name,
                [
                    (
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        return self._write(call, current, self._combine(call, current, new))

    def _patch(self, call: _Call) -> int:
        k = call.kind
        content_type = call.handler.headers.get("Content-Type", "")
        applying = patch.media_type(k, content_type) == patch.APPLY
        apply.check_options(call.query, applying=applying)
        if applying:
            config = apply.decode(k, call.body, call.name)
            if call.sub:
                raise BadRequest(
                    f"the devcluster applies to whole objects, not to the {call.sub} subresource"
                )
        explicit_rv = not applying and _patch_sets_resource_version(content_type, call.body)
        for _ in range(50):
            current = self.store.find(k.resource, call.ns, call.name)
            if applying:
                manager, force = call.query["fieldManager"], _flag(call.query, "force")
                if current is None:  # apply creates what is absent (forceAllowCreate)
                    return self._store_new(call, apply.apply(k, None, config, manager, force=force), None)
                merged = apply.apply(k, current, config, manager, force=force)
                try:
                    return self._write(call, current, self._combine(call, current, merged), applied=True)
                except Conflict as conflict:
                    if isinstance(conflict, apply.ApplyConflict) or config["metadata"].get("resourceVersion"):
                        raise
                    continue
            if current is None:
                raise NotFound(f'{k.resource} "{call.name}" not found', resource=k.resource, name=call.name)
            view = _scale_of(current) if call.sub == "scale" else _out(k, current)
            patched = patch.apply(_SCALE if call.sub == "scale" else k, content_type, call.body, view)
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata", {}), dict):
                raise BadRequest("the patch made the object something other than a JSON object")
            patched.setdefault("metadata", {})
            try:
                return self._write(call, current, self._combine(call, current, patched))
            except Conflict:
                if explicit_rv:
                    raise
        raise Conflict(
            f'Operation cannot be fulfilled on {k.resource} "{call.name}": too many concurrent writes',
            resource=k.resource,
            name=call.name,
        )

    def _combine(self, call: _Call, current: dict, new: dict) -> dict:
        """What an update of ``call.sub`` makes of ``current``: the main resource ignores .status,
        /status changes only .status, /scale only spec.replicas."""
        k = call.kind
        new_rv = new["metadata"].get("resourceVersion")
        if call.sub == "scale":
            replicas = (new.get("spec") or {}).get("replicas", 0)
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise Invalid(
                    "Scale",
                    call.name,
                    [
                        (
                            "spec.replicas",
                            "FieldValueInvalid",
                            f"Invalid value: {json.dumps(replicas)}: must be greater than or equal to 0",
                        )
                    ],
                )
            result = copy.deepcopy(current)
            result.setdefault("spec", {})["replicas"] = replicas
        elif call.sub == "status":
            result = copy.deepcopy(current)
            if k.kind == "Node":  # nodeStatusStrategy keeps only the spec: labels and annotations change too
                system = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")
                kept = {key: current["metadata"][key] for key in system if key in current["metadata"]}
                result["metadata"] = {**new["metadata"], **kept, "name": call.name}
                result["metadata"].pop("namespace", None)
            if new.get("status") is None:
                result.pop("status", None)
            else:
                result["status"] = new["status"]
        else:
            result = new
            if k.namespaced:
                result["metadata"]["namespace"] = call.ns
            else:
                result["metadata"].pop("namespace", None)
            result["metadata"]["name"] = call.name
            if k.has_status:
                if current.get("status") is None:
                    result.pop("status", None)
                else:
                    result["status"] = current["status"]
            for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                if field in current["metadata"]:
                    result["metadata"][field] = current["metadata"][field]
                else:
                    result["metadata"].pop(field, None)
        result["metadata"]["resourceVersion"] = new_rv or current["metadata"]["resourceVersion"]
        if new_rv and new_rv != current["metadata"]["resourceVersion"]:
            raise Conflict(
                f'Operation cannot be fulfilled on {k.resource} "{call.name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                resource=k.resource,
                name=call.name,
            )
        return result

    def _write(self, call: _Call, current: dict, result: dict, *, applied: bool = False) -> int:
        """Store an update, a patch or an apply (``applied``: its managedFields are already recorded)."""
        k = call.kind
        result.setdefault("apiVersion", k.api_version)
        result.setdefault("kind", k.kind)
        defaults.apply(k, result, creating=False)
        if not applied:
            result["metadata"]["managedFields"] = current["metadata"].get("managedFields") or []
            apply.record_update(k, current, result, _manager(call), call.sub)
        warnings = validate(k, result, field_validation=call.query.get("fieldValidation", ""))
        validate_update(k, result, current)
        if not call.sub:
            admission_policy.prepare(k, result)
        result, admitted = self._admit(call, "UPDATE", result, current)
        warnings += admitted
        if call.dry_run:
            stored = result
        else:
            stored = self.store.update(k.resource, result, check_version=True)
            stored = gc.remove_if_finalized(self.store, k.resource, stored)
        body = _scale_of(stored) if call.sub == "scale" else _out(k, stored)
        return _send(call.handler, 200, _dumps(body), headers=_warning_headers(warnings))

    def _get_scale(self, call: _Call) -> int:
        return _send(
            call.handler, 200, _dumps(_scale_of(self.store.get(call.kind.resource, call.ns, call.name)))
        )

    def _delete_options(self, call: _Call) -> dict:
        options: dict = {}
        if call.body.strip():
            try:
                options = json.loads(call.body)
            except ValueError as exc:
                raise BadRequest(f"the DeleteOptions provided are malformed: {exc}") from None
            if not isinstance(options, dict):
                raise BadRequest("the DeleteOptions provided must be a JSON object")
        if "propagationPolicy" in call.query:
            options["propagationPolicy"] = call.query["propagationPolicy"]
        if "gracePeriodSeconds" in call.query:
            options["gracePeriodSeconds"] = _int_param(call.query, "gracePeriodSeconds", 0)
        if call.query.get("orphanDependents") in ("true", "false") and "propagationPolicy" not in options:
            options["propagationPolicy"] = (
                "Orphan" if call.query["orphanDependents"] == "true" else "Background"
            )
        if options.get("orphanDependents") is not None and "propagationPolicy" not in options:
            options["propagationPolicy"] = "Orphan" if options["orphanDependents"] else "Background"
        if call.query.get("dryRun") == "All" or options.get("dryRun") == ["All"]:
            options["dryRun"] = True
        return options

    def _delete_one(self, call: _Call, name: str, options: dict) -> dict:
        current = self.store.get(call.kind.resource, call.ns, name)
        self._admit(dataclasses.replace(call, name=name), "DELETE", None, current)
        if options.get("dryRun") is True:
            return self.store.get(call.kind.resource, call.ns, name)
        pre = options.get("preconditions") or {}
        return gc.delete_object(
            self.store,
            call.kind.resource,
            call.ns,
            name,
            propagation=options.get("propagationPolicy"),
            grace_seconds=options.get("gracePeriodSeconds"),
            resource_version=pre.get("resourceVersion"),
            uid=pre.get("uid"),
        )

    def _delete(self, call: _Call) -> int:
        obj = self._delete_one(call, call.name, self._delete_options(call))
        return _send(call.handler, 200, _dumps(_out(call.kind, obj)))

    def _delete_collection(self, call: _Call) -> int:
        options = self._delete_options(call)
        k, q = call.kind, call.query
        selects = _selectors(q, k.resource)
        deleted = []
        for obj in self.store.list(k.resource, call.namespace)[0]:
            if all(s(obj) for s in selects):
                try:
                    deleted.append(
                        _out(
                            k,
                            self._delete_one(
                                _Call(
                                    call.method,
                                    k,
                                    obj["metadata"].get("namespace", ""),
                                    "",
                                    "",
                                    q,
                                    b"",
                                    call.handler,
                                    call.user,
                                ),
                                obj["metadata"]["name"],
                                options,
                            ),
                        )
                    )
                except (NotFound, Conflict):
                    continue
        body = {
            "kind": f"{k.kind}List",
            "apiVersion": k.api_version,
            "metadata": {"resourceVersion": str(self.store.resource_version)},
            "items": deleted,
        }
        return _send(call.handler, 200, _dumps(body))

    # ---- pod subresources --------------------------------------------------------------
    def _evict(self, call: _Call) -> int:
        try:
            eviction = json.loads(call.body or b"{}")
        except ValueError as exc:
            raise BadRequest(f"the Eviction provided is malformed: {exc}") from None
        if not isinstance(eviction, dict):
            raise BadRequest("the Eviction provided must be a JSON object")
        named = (eviction.get("metadata") or {}).get("name")
        if named and named != call.name:
            raise BadRequest(f"name in URL does not match name in Eviction object: {call.name} != {named}")
        options = eviction.get("deleteOptions") or {}
        self._admit(call, "CREATE", {"apiVersion": "policy/v1", "kind": "Eviction", **eviction}, None)
        for _ in range(50):
            pod = self.store.get("pods", call.ns, call.name)
            if pdb.needs_budget(pod):
                budgets = [
                    b
                    for b in self.store.list("poddisruptionbudgets.policy", call.ns)[0]
                    if pdb.matches(b, pod)
                ]
                if len(budgets) > 1:
                    raise InternalError(
                        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
                    )
                if budgets:
                    budget = copy.deepcopy(budgets[0])
                    new_status = pdb.check_eviction(budget, pod)
                    if call.dry_run:  # the budget's answer, nothing consumed or deleted
                        return _send(call.handler, 201, _dumps(_success(201)))
                    if new_status is not None:
                        budget["status"] = new_status
                        try:
                            self.store.update("poddisruptionbudgets.policy", budget, check_version=True)
                        except Conflict:
                            continue
            if call.dry_run:
                return _send(call.handler, 201, _dumps(_success(201)))
            pre = options.get("preconditions") or {}
            gc.delete_object(
                self.store,
                "pods",
                call.ns,
                call.name,
                grace_seconds=options.get("gracePeriodSeconds"),
                resource_version=pre.get("resourceVersion"),
                uid=pre.get("uid"),
            )
            return _send(call.handler, 201, _dumps(_success(201)))
        raise Conflict(
            f'Operation cannot be fulfilled on pods/eviction "{call.name}": the PodDisruptionBudget kept '
            "changing; try again",
            resource="pods/eviction",
            name=call.name,
        )

    def _bind(self, call: _Call) -> int:
        try:
            binding = json.loads(call.body or b"{}")
            node = binding["target"]["name"]
        except (ValueError, KeyError, TypeError):
            raise BadRequest("a Binding needs target.name (the node)") from None

        def assign(pod: dict) -> None:
            if pod["spec"].get("nodeName"):
                raise Conflict(
                    f'Operation cannot be fulfilled on pods/binding "{call.name}": pod {call.name} is already '
                    f'assigned to node "{pod["spec"]["nodeName"]}"',
                    resource="pods/binding",
                    name=call.name,
                )
            pod["spec"]["nodeName"] = node

        self.store.mutate("pods", call.ns, call.name, assign)
        return _send(call.handler, 201, _dumps(_success(201)))

    def _token_request(self, call: _Call) -> int:
        answer = self.tokens.request(call.ns, call.name, _json_body(call.body))
        return _send(call.handler, 201, _dumps(answer))

    def _log(self, call: _Call) -> int:
        q = call.query
        pod = self.store.get("pods", call.ns, call.name)
        names = [c.get("name") for c in pod["spec"].get("containers") or []]
        container = q.get("container") or (names[0] if names else "")
        if container not in names:
            raise BadRequest(f"container {container} is not valid for pod {call.name}")
        text = self.logs.read(call.ns, call.name)
        if not text and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            raise BadRequest(
                f'container "{container}" in pod "{call.name}" is waiting to start: ContainerCreating'
            )
        if not _flag(q, "follow"):
            return _send(call.handler, 200, _tail(text, q).encode(), "text/plain")
        h = call.handler
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        sent = _tail(text, q)
        if sent:
            _chunk(h, sent.encode())
        sent = text
        try:
            while not self._stopping.is_set():
                pod = self.store.find("pods", call.ns, call.name)
                text = self.logs.read(call.ns, call.name)
                if len(text) > len(sent):
                    _chunk(h, text[len(sent) :].encode())
                    sent = text
                if (
                    pod is None
                    or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                    or _client_gone(h)
                ):
                    break
                time.sleep(0.1)
            _end_stream(h)
        except OSError:
            pass
        return 200


# ---- HTTP plumbing ------------------------------------------------------------------------
class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the stdlib's 5 refuses connections when many clients arrive at once

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLError):
            return  # a client that went away, or refused the certificate, is not a server error
        log.exception("connection from %s failed", client_address)  # to the log, not the terminal


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: headers and body go out as separate writes; with Nagle's algorithm and the
    # client's delayed ACK every response would stall ~40-100 ms on a kept-alive connection.
    disable_nagle_algorithm = True
    server_version = "devcluster"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the audit log records requests
        return

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        on_status = getattr(self, "on_status", None)
        if on_status:
            on_status(code)

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()

    def _serve(self) -> None:
        self.server.api.serve(self)  # type: ignore[attr-defined]

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                h.rfile.readline()
                return b"".join(parts)
            parts.append(h.rfile.read(size))
            h.rfile.readline()
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length else b""


def _injected(code: int, path: str) -> StoreError:
    if code == 429:
        return TooManyRequests(
            "the server has received too many requests and has asked us to try again later", retry_after=1
        )
    if code == 503:
        return ServiceUnavailable(
            f"the server is currently unable to handle the request (injected for {path})"
        )
    return InternalError(f"Internal error occurred: injected fault for {path}")


def _from_protobuf(body: bytes) -> bytes:
    try:
        return _dumps(protobuf.to_json(body))
    except protobuf.Unsupported as exc:
        raise UnsupportedMediaType(
            f"the devcluster does not decode protobuf for {exc} (only {', '.join(protobuf.KINDS)}): send "
            "application/json (accepted media types include: application/json)"
        ) from None


def _send(
    h: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str = JSON, headers: dict | None = None
) -> int:
    h.send_response(code)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.send_header("Cache-Control", "no-cache, private")
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(body)
    return code


def _start_stream(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", JSON)
    h.send_header("Transfer-Encoding", "chunked")
    h.send_header("Cache-Control", "no-cache, private")
    h.end_headers()
    h.wfile.flush()


def _chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    h.wfile.flush()


def _end_stream(h: BaseHTTPRequestHandler) -> None:
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()
    h.close_connection = True


class Cancelled(StoreError):
    """The request's connection closed before it was applied."""


def _cancel_if_gone(h: BaseHTTPRequestHandler, window_s: float) -> None:
    """Raise ``Cancelled`` when the client has closed the connection (waiting up to ``window_s`` for
    it to): kube-apiserver cancels a request whose connection closes before it is applied and
    applies nothing (its log: 504 ``context canceled``).  That is what a client meets that sends a
    request on a connection whose previous response it released unread (urllib3's ``release_conn()``
    on an unread body): it fails at once, closing the connection, while the request is on its way.
    kube-apiserver's writes take milliseconds (etcd), so the close nearly always wins there; the
    devcluster's take microseconds, hence the window (0: look once)."""
    if _client_gone(h, window_s):
        raise Cancelled("the client closed the connection")


def _client_gone(h: BaseHTTPRequestHandler, wait_s: float = 0.0) -> bool:
    """True once the client closed its end of the connection (waiting up to ``wait_s`` for it)."""
    try:
        poller = select.poll()  # not select.select: a fleet's scrapes hold descriptors past its 1,024
        poller.register(h.connection, select.POLLIN)
        readable = poller.poll(wait_s * 1000)
        if readable and isinstance(h.connection, ssl.SSLSocket):
            return True  # TLS cannot peek; a client sends nothing but its close alert mid-response
        return bool(readable) and not h.connection.recv(1, 0x2)  # MSG_PEEK
    except OSError:
        return True


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _out(kind: Kind, obj: dict) -> dict:
    """The object as the API returns it (with apiVersion and kind); a shallow copy, never a deep one."""
    return {"apiVersion": kind.api_version, "kind": kind.kind, **obj}


def _success(code: int) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}


def _key(obj: dict) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _encode_continue(rv: int, key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(_dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(key)})).decode()


def _selectors(query: dict, resource: str) -> list:
    """The label and field selectors a list, watch or deletecollection asked for."""
    wanted = (
        label_selector(query.get("labelSelector")),
        field_selector(query.get("fieldSelector"), resource),
    )
    return [s for s in wanted if s]


def _flag(query: dict, name: str) -> bool:
    """A boolean query parameter (clients send 1, true or True)."""
    return query.get(name, "").lower() in ("1", "true")


def _int_param(query: dict, name: str, default: int) -> int:
    value = query.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"{name}: invalid value {value!r}: must be an integer") from None


def _manager(call: _Call) -> str:
    return apply.manager_of(call.query, call.handler.headers.get("User-Agent", ""))


def _wants_table(call: _Call) -> bool:
    return "as=Table" in call.handler.headers.get("Accept", "")


def _warning_headers(warnings: list[str]) -> dict | None:
    if not warnings:
        return None
    return {"Warning": ", ".join('299 - "' + w.replace('"', '\\"') + '"' for w in warnings)}


def _tail(text: str, query: dict) -> str:
    lines = text.splitlines(keepends=True)
    if query.get("tailLines"):
        count = _int_param(query, "tailLines", 0)
        lines = lines[-count:] if count else []
    out = "".join(lines)
    if query.get("limitBytes"):
        out = out[: _int_param(query, "limitBytes", 0)]
    return out


def _scale_of(deployment: dict) -> dict:
    meta = deployment["metadata"]
    match = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": (deployment.get("spec") or {}).get("replicas", 0)},
        "status": {
            "replicas": (deployment.get("status") or {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in match.items()),
        },
    }


def _reset_status(kind: Kind, obj: dict) -> None:
    """Creation drops a client-written status (nodes keep theirs, as kubelets register them); built-in
    kinds then read back an empty status until a controller fills it, as from a real API server: its
    required counters (not ``omitempty`` in Go, e.g. a DaemonSet's) are 0, the rest absent."""
    if kind.kind == "Pod":
        obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}
    elif kind.has_status and kind.kind not in ("Node", "Namespace"):
        obj.pop("status", None)
        if not kind.custom:
            schema = openapi.resolve(openapi.child(openapi.schema_of(kind), "status")) or {}
            obj["status"] = {field: 0 for field in schema.get("required") or ()}


def _qos_class(spec: dict) -> str:
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    requests, limits = [], []
    for c in containers:
        resources = (c.get("resources") or {}) if isinstance(c, dict) else {}
        requests.append(
            {k: v for k, v in (resources.get("requests") or {}).items() if k in ("cpu", "memory")}
        )
        limits.append({k: v for k, v in (resources.get("limits") or {}).items() if k in ("cpu", "memory")})
    if not any(requests) and not any(limits):
        return "BestEffort"
    guaranteed = all(
        set(lim) == {"cpu", "memory"} and all(str(req.get(r, lim[r])) == str(lim[r]) for r in lim)
        for req, lim in zip(requests, limits, strict=True)
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _patch_sets_resource_version(content_type: str, body: bytes) -> bool:
    try:
        data = json.loads(body)
    except ValueError:
        return False
    if isinstance(data, list):
        return any(isinstance(op, dict) and op.get("path") == "/metadata/resourceVersion" for op in data)
    return (
        isinstance(data, dict)
        and isinstance(data.get("metadata"), dict)
        and bool(data["metadata"].get("resourceVersion"))
    )


def _selected_event(event: Event, selects: list, matched: dict) -> str | None:
    """The event type a selector watch sends: objects that stop matching are DELETED, objects
    that start matching ADDED, as the real watch cache does.  ``matched`` remembers, per object,
    whether the client holds it; for an object this watch has not sent yet, the client holds it when
    its previous state matched (an object that never matched is never sent, not even as DELETED)."""
    if not selects:
        return event.type
    key = _key(event.object)
    now = all(s(event.object) for s in selects)
    if event.type == DELETED:
        before = matched.pop(key, None)
        return DELETED if (now if before is None else before) else None
    before = matched.get(key)
    if before is None and event.type == MODIFIED:
        before = event.previous is not None and all(s(event.previous) for s in selects)
    matched[key] = now
    if now:
        return ADDED if event.type == ADDED or before is False else MODIFIED
    return DELETED if before is not False and event.type == MODIFIED else None


def _json_body(body: bytes) -> dict:
    try:
        obj = json.loads(body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"the object provided is unrecognized or malformed: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest("the object provided is unrecognized (a JSON object is required)")
    return obj


def _resource_call(
    served: kinds.Served, h: BaseHTTPRequestHandler, path: str, query: dict, body: bytes, user: User
) -> _Call | None:
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        candidate = served.by_path(group, version, rest[2])
        if candidate is not None and candidate.namespaced:
            namespace, rest = rest[1], rest[2:]
    kind = served.by_path(group, version, rest[0])
    if kind is None or len(rest) > 3:
        return None
    if kind.namespaced and namespace is None and len(rest) > 1:
        return None  # a namespaced object needs its namespace in the path
    if not kind.namespaced and namespace is not None:
        return None
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if kind.namespaced and namespace is None and h.command != "GET":
        return None
    return _Call(h.command, kind, namespace, name, sub, query, body, h, user)

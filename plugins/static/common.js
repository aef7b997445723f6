// What the two trainops views share. They are React apps of the Airflow UI: they render with the UI's own
// React, Chakra UI and router (globals the UI sets for plugins), so its theme, colour mode and navigation
// are theirs; their data comes from the plugin's JSON API under trainops/api/, with the UI's login cookie.
export const React = globalThis.React;
export const C = globalThis.ChakraUI;
export const RouterLink = globalThis.ReactRouterDOM.Link;
export const h = React.createElement;
const {useCallback, useEffect, useState} = React;

// Paths of the plugin are resolved against the UI's base URL (Airflow's [api] base_url).
export const apiUrl = (path) => new URL(`trainops/api/${path}`, document.baseURI).href;
const enc = encodeURIComponent;
export const dagRunPath = (dagId, runId) => `/dags/${enc(dagId)}/runs/${enc(runId)}`;
export const runViewPath = (dagId, runId) => `${dagRunPath(dagId, runId)}/plugin/trainops-run`;

// Airflow's answer as an error to show: its detail, and for a login that expired a way back in.
async function failure(response) {
  const text = await response.text();
  let detail = text;
  try { detail = JSON.parse(text).detail ?? text; } catch { /* not JSON: the text itself */ }
  return {status: response.status, detail: typeof detail === "string" ? detail : JSON.stringify(detail)};
}

// GET ``path`` of the API: [{data, error, loading}, reload].
export function useApi(path) {
  const [state, setState] = useState({data: null, error: null, loading: true});
  const load = useCallback(async () => {
    try {
      const response = await fetch(apiUrl(path), {credentials: "same-origin"});
      if (!response.ok) return setState({data: null, error: await failure(response), loading: false});
      setState({data: await response.json(), error: null, loading: false});
    } catch (error) {
      setState({data: null, error: {status: 0, detail: String(error)}, loading: false});
    }
  }, [path]);
  useEffect(() => { load(); }, [load]);
  return [state, load];
}

// POST ``body`` to ``path``: {data} or {error}.
export async function post(path, body) {
  const response = await fetch(apiUrl(path), {
    method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  return response.ok ? {data: await response.json()} : {error: await failure(response)};
}

export function ErrorText({error}) {
  if (!error) return null;
  const login = error.status === 401 || error.status === 403;
  return h(C.Alert.Root, {status: "error", id: "error", my: 2},
    h(C.Alert.Indicator),
    h(C.Alert.Description, null,
      login ? [`Not allowed (${error.status}): ${error.detail} `,
        h(C.Link, {key: "login", href: new URL(`auth/login/?next=${enc(location.href)}`, document.baseURI).href, colorPalette: "blue"}, "Log in")]
        : `${error.status}: ${error.detail}`));
}

// The timezone the user chose in the UI (its user menu keeps it in localStorage "timezone"), followed live.
const browserZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
function chosenZone() {
  try { return JSON.parse(localStorage.getItem("timezone")) || browserZone; } catch { return browserZone; }
}
export function useTimezone() {
  const [zone, setZone] = useState(chosenZone);
  useEffect(() => {
    const follow = () => setZone(chosenZone());
    globalThis.addEventListener("storage", follow);  // another tab
    globalThis.addEventListener("local-storage", follow);  // this tab's user menu
    return () => { globalThis.removeEventListener("storage", follow); globalThis.removeEventListener("local-storage", follow); };
  }, []);
  return zone;
}

// "2026-05-01 14:30:05 +02:00": a time (epoch seconds or an ISO string) as the UI writes times, in ``zone``.
export function formatTime(when, zone, {date = true} = {}) {
  if (when == null) return "";
  const instant = typeof when === "number" ? new Date(when * 1000) : new Date(when);
  const parts = Object.fromEntries(new Intl.DateTimeFormat("en-US", {
    timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "longOffset",
  }).formatToParts(instant).map((p) => [p.type, p.value]));
  const time = `${parts.hour}:${parts.minute}:${parts.second}`;
  const offset = parts.timeZoneName.replace("GMT", "") || "+00:00";  // as the UI's clock shows its zone
  return `${date ? `${parts.year}-${parts.month}-${parts.day} ` : ""}${time} ${offset}`;
}

// "12 s ago", "4 min ago", "3 h ago"
export function ago(when) {
  const then = typeof when === "number" ? when * 1000 : Date.parse(when);
  const s = Math.max(0, Math.round((Date.now() - then) / 1000));
  return s < 120 ? `${s} s ago` : s < 7200 ? `${Math.round(s / 60)} min ago` : `${Math.round(s / 3600)} h ago`;
}

// A link inside the UI (its router: no page load); ``to`` is a path of the UI.
export const UiLink = ({to, children, ...props}) =>
  h(C.Link, {asChild: true, colorPalette: "blue", ...props}, h(RouterLink, {to}, children));

// The UI's way to confirm a change: a dialog that asks for a typed word. ``onConfirm(typed)``.
export function ConfirmDialog({open, title, message, expected, action, onConfirm, onClose}) {
  const [typed, setTyped] = useState("");
  useEffect(() => { if (open) setTyped(""); }, [open]);
  return h(C.Dialog.Root, {open, onOpenChange: (e) => { if (!e.open) onClose(); }, role: "alertdialog"},
    h(C.Portal, null,
      h(C.Dialog.Backdrop),
      h(C.Dialog.Positioner, null,
        h(C.Dialog.Content, {"data-testid": "confirm-dialog"},
          h(C.Dialog.Header, null, h(C.Dialog.Title, null, title)),
          h(C.Dialog.Body, null,
            h(C.Text, {mb: 3}, message),
            h(C.Input, {id: "confirm-input", value: typed, placeholder: expected, autoFocus: true,
              onChange: (e) => setTyped(e.target.value)})),
          h(C.Dialog.Footer, null,
            h(C.Button, {variant: "outline", onClick: onClose}, "Cancel"),
            h(C.Button, {id: "confirm-button", colorPalette: "red", disabled: typed !== expected,
              onClick: () => onConfirm(typed)}, action))))));
}

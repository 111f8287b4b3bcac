// The broker's live view: topics with rates and lag; one topic's records, delivered rate, and a
// demand control. The page is a Reactive Streams subscriber that requests at most what the
// control allows per 100 ms, so on a `backpressure` topic the producer slows to its pace.
// The broker serves it (rsnet/broker/live.py) and says in /live/config.json where its WebSocket
// endpoint is; ?broker=ws://HOST:PORT/ overrides that (&topic=NAME&demand=N start subscribed).
import { ErrorCode, connect, topics } from "./rsnet-client.js";

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const TICK_MS = 100;
const UNAUTHORIZED = ErrorCode.UNAUTHORIZED;
const DEMAND = { min: 10, max: 5000, initial: 2000 }; // the control's range (live.html)

/** Records/s from `text`, within the control's range; null if it is no number. */
function demandFrom(text) {
  const value = Math.round(Number(text));
  return Number.isFinite(value) ? Math.min(DEMAND.max, Math.max(DEMAND.min, value)) : null;
}
const askedDemand = query.get("demand");
// Said with the connection's status: a ?demand= the page cannot use is not silently NaN.
const demandNote =
  askedDemand !== null && demandFrom(askedDemand) === null
    ? ` (?demand=${askedDemand} is no number of records/s: ${DEMAND.initial} it is)`
    : "";

const state = {
  demand: (askedDemand !== null && demandFrom(askedDemand)) || DEMAND.initial,
  delivered: 0,
  outstanding: 0, // requested and not yet delivered
  arrivals: [], // timestamps of the last second's deliveries, for the rate
  history: [], // [time, rate] every 250 ms for the chart, the last minute
  recent: [],
  subscription: null,
  topic: null,
  error: null,
};

/** What the page's test reads. */
window.liveView = {
  get connected() { return conn !== null; },
  get delivered() { return state.delivered; },
  get demand() { return state.demand; },
  get error() { return state.error && String(state.error); },
  rate,
  setDemand,
};

function json(value) {
  return JSON.stringify(value, (_, v) => (typeof v === "bigint" ? v.toString() : v instanceof Uint8Array ? `<${v.length} bytes>` : v));
}

function rate() {
  const now = performance.now();
  while (state.arrivals.length && state.arrivals[0] < now - 1000) state.arrivals.shift();
  return state.arrivals.length;
}

function setDemand(value) {
  state.demand = demandFrom(value) ?? state.demand;
  $("demand").value = String(state.demand);
  $("demand-value").textContent = String(state.demand);
}

// ---- the connection: where to, from the broker's configuration unless the URL says otherwise
let conn = null;
// A connection that ends (the broker stopped or restarted) is opened again, after 1 s, then
// twice as long after each failed try, up to RETRY_MAX_MS; a refused token stops the retries.
const RETRY_MS = 1000;
const RETRY_MAX_MS = 10000;
let retry = null; // the timer of a scheduled reconnection
let attempts = 0; // connections begun: only the latest one's outcome counts

async function brokerConfig() {
  try {
    const response = await fetch("/live/config.json");
    if (response.ok) return await response.json();
  } catch {
    // opened from elsewhere than a broker: the user types the URL
  }
  return { websocket: null, auth: false };
}

function websocketUrl(endpoint) {
  if (!endpoint) return "";
  let host = endpoint.host ?? location.hostname; // null: the broker listens on every address
  if (host.includes(":") && !host.startsWith("[")) host = `[${host}]`;
  return `${endpoint.scheme}://${host}:${endpoint.port}/`;
}

/**
 * Connect to `url`; `resume`: the topic to subscribe to again once connected (a reconnection),
 * with `delay` the wait before the next try should this one fail too.
 */
async function open(url, token, resume = null, delay = RETRY_MS) {
  clearTimeout(retry);
  retry = null;
  const attempt = ++attempts;
  state.subscription?.cancel();
  Object.assign(state, { subscription: null, topic: null });
  $("stream").hidden = true;
  const previous = conn;
  conn = null;
  previous?.close().catch(() => {});
  clearTopics();
  $("status").textContent = `connecting to ${url}…`;
  let opened;
  try {
    opened = await connect(url, token ? { token } : {});
  } catch (error) {
    if (attempt !== attempts) return; // the user connected elsewhere meanwhile
    // A failure to reach the broker already says "cannot connect to URL"; a refusal says why.
    $("status").textContent = error.message.startsWith("cannot connect") ? error.message : `cannot connect to ${url}: ${error.message}`;
    if (error.code === UNAUTHORIZED) {
      // ?broker= may name a broker with tokens where this page's own has none: ask for one.
      $("token-field").hidden = false;
      $("status").textContent = `${url} requires a token${token ? ": that one was refused" : ""}`;
    } else if (resume !== null) {
      reconnect(url, token, resume, delay, $("status").textContent);
    }
    return;
  }
  if (attempt !== attempts) {
    opened.close().catch(() => {}); // the user connected elsewhere meanwhile
    return;
  }
  conn = opened;
  opened.closed.then(() => {
    if (conn !== opened) return; // replaced on purpose
    const topic = state.topic ?? resume ?? "";
    conn = null;
    state.subscription = null;
    clearTopics();
    reconnect(url, token, topic, RETRY_MS, `connection to ${url} ended`);
  });
  $("status").textContent = `connected to ${url}${demandNote}`;
  await refreshTopics().catch(showError);
  const topic = resume || query.get("topic");
  if (topic && !state.topic) subscribeTo(topic);
}

/** Try `url` again in `delay` ms, saying so after `why`. */
function reconnect(url, token, topic, delay, why) {
  const next = Math.min(delay * 2, RETRY_MAX_MS);
  retry = setTimeout(() => open(url, token, topic, next), delay);
  $("status").textContent = `${why}: trying again in ${Math.round(delay / 1000)} s`;
}

/** No connection: no figures that would read as current. */
function clearTopics() {
  $("topics").tBodies[0].replaceChildren();
  previousTopics = new Map();
  Object.assign(state, { arrivals: [], history: [], recent: [], outstanding: 0 });
  $("stream").hidden = true;
}

function showError(error) {
  $("status").textContent = error.message;
}

// ---- topics, polled once a second through $topics
let previousTopics = new Map();
async function refreshTopics() {
  if (!conn) return;
  const now = performance.now();
  const asked = conn;
  const list = await topics(asked);
  if (conn !== asked) return; // the connection ended while the answer was on its way
  const body = $("topics").tBodies[0];
  body.replaceChildren();
  for (const t of list) {
    const before = previousTopics.get(t.topic);
    const seconds = before ? (now - before.at) / 1000 : 0;
    const inRate = before && seconds > 0 ? Math.round((Number(t.records_in) - before.in) / seconds) : 0;
    const outRate = before && seconds > 0 ? Math.round((Number(t.records_out) - before.out) / seconds) : 0;
    const lag = Math.max(0, ...t.subscribers.map((s) => Number(s.lag)));
    const row = body.insertRow();
    row.dataset.topic = t.topic;
    if (t.topic === state.topic) row.className = "selected";
    for (const cell of [t.topic, t.policy, t.next_offset, inRate, outRate, t.subscriber_count ?? t.subscribers.length, lag]) {
      row.insertCell().textContent = String(cell);
    }
    row.onclick = () => subscribeTo(t.topic);
    previousTopics.set(t.topic, { at: now, in: Number(t.records_in), out: Number(t.records_out) });
  }
}
setInterval(() => refreshTopics().catch((error) => conn && showError(error)), 1000);

// ---- one topic, consumed with explicit demand
function subscribeTo(topic) {
  if (!conn) return;
  state.subscription?.cancel();
  Object.assign(state, { topic, delivered: 0, outstanding: 0, arrivals: [], history: [], recent: [], error: null });
  $("stream").hidden = false;
  $("topic-name").textContent = topic;
  if (!previousTopics.has(topic)) {
    // As `rsnet sub` says it: the broker waits for its first record (or refuses, said below).
    $("status").textContent = `topic ${topic} does not exist yet: waiting for its first record`;
  }
  conn.publisher(topic, { from: "latest" }).subscribe({
    onSubscribe(subscription) {
      state.subscription = subscription;
    },
    onNext(record) {
      state.delivered += 1;
      state.outstanding -= 1;
      state.arrivals.push(performance.now());
      state.recent.unshift(record);
      if (state.recent.length > 15) state.recent.length = 15;
    },
    onError(error) {
      state.error = error;
      $("status").textContent = `stream ended: ${error.message}`;
    },
    onComplete() {
      $("status").textContent = "stream completed";
    },
  });
}

// Demand: keep at most one tick's worth of records requested (rule 3.8: request is cumulative,
// so granting more than that would let the broker run ahead of the control).
setInterval(() => {
  if (!state.subscription || state.error) return;
  const perTick = Math.max(1, Math.round((state.demand * TICK_MS) / 1000));
  if (state.outstanding < perTick) {
    state.subscription.request(perTick - state.outstanding);
    state.outstanding = perTick;
  }
}, TICK_MS);

$("demand").value = String(state.demand);
$("demand-value").textContent = String(state.demand);
$("demand").oninput = (event) => setDemand(event.target.value);

// ---- drawing, 4 times a second
function draw() {
  $("rate").textContent = String(rate());
  $("delivered").textContent = String(state.delivered);
  $("outstanding").textContent = String(state.outstanding);
  const body = $("records").tBodies[0];
  body.replaceChildren();
  for (const r of state.recent) {
    const row = body.insertRow();
    row.insertCell().textContent = String(r.offset);
    row.insertCell().textContent = new Date(Number(r.timestamp)).toISOString().slice(11, 23);
    row.insertCell().textContent = json(r.value);
  }
  const canvas = $("chart");
  const g = canvas.getContext("2d");
  const { width, height } = canvas;
  g.clearRect(0, 0, width, height);
  const points = state.history;
  const span = Math.max(points.length - 1, 40); // at least 10 s wide, then the whole last minute
  const top = Math.max(100, ...points.map(([, r]) => r), state.demand) * 1.1;
  g.strokeStyle = "#ccc";
  g.beginPath();
  const demandY = height - (state.demand / top) * height;
  g.moveTo(0, demandY);
  g.lineTo(width, demandY);
  g.stroke();
  g.fillStyle = "#777";
  g.fillText(`demand ${state.demand}/s`, 4, Math.max(12, demandY - 4));
  g.strokeStyle = "#e63946";
  g.lineWidth = 2;
  g.beginPath();
  points.forEach(([, r], i) => {
    const x = (i / span) * width;
    const y = height - (r / top) * height;
    if (i === 0) g.moveTo(x, y);
    else g.lineTo(x, y);
  });
  g.stroke();
  g.lineWidth = 1;
}
setInterval(() => {
  if (state.topic) {
    state.history.push([performance.now(), rate()]);
    if (state.history.length > 240) state.history.shift();
  }
}, 250);
setInterval(draw, 250);

// ---- start: connect at once unless the broker wants a token or has no WebSocket listener
const config = await brokerConfig();
$("broker-url").value = query.get("broker") ?? websocketUrl(config.websocket);
$("token-field").hidden = !config.auth;
$("connect").onsubmit = (event) => {
  event.preventDefault();
  open($("broker-url").value.trim(), $("token").value);
};
if (!$("broker-url").value) {
  $("status").textContent = "this broker has no WebSocket listener (rsnet broker --ws HOST:PORT): enter a broker's ws:// URL";
} else if (config.auth) {
  $("status").textContent = "this broker requires a token";
} else {
  open($("broker-url").value, "");
}

/**
 * The sans-I/O state machine of one rsnet connection (protocol/SPEC.md is the contract), a
 * port of the Python reference `rsnet.protocol.Connection`, for either role.
 *
 * Feed received bytes to `receiveData`, take what happened from `eventsReceived`, call
 * `send*` methods to produce frames, and write `dataToSend()` (or `dataToSendMessages()` on a
 * WebSocket) to the transport. Every rule of the spec is enforced in both directions: a peer's
 * violation is answered with the documented code (a stream error keeps the connection,
 * anything else closes it); a local call that would break a rule throws `ProtocolError` and
 * writes nothing, so a bug in the application can never over-send.
 *
 * A stream leaves the table as soon as either side ends it. Ids are never reused, so an id
 * below the next one its side will allocate that is not in the table belongs to a closed
 * stream: frames for it are dropped (late frames after CANCEL, rule 2.8) and sends on it are
 * no-ops (rules 3.6, 3.7).
 *
 * Demand is a JS number: demand that reaches 2^53 or more is treated as unbounded (it could
 * only be used up after 2^53 items), and 2^63-1 is unbounded as SPEC 8.2 says.
 *
 * No sockets, timers or promises here: the client (client.ts) drives it.
 */
import { Encoder, Scanner } from "./codec.js";
import { ErrorCode, ProtocolError, type Code } from "./errors.js";
import {
  DEFAULT_KEEPALIVE_INTERVAL,
  DEFAULT_MAX_FRAME_SIZE,
  DEFAULT_MAX_STREAMS,
  FrameReader,
  MAGIC,
  MAX_INT,
  MAX_SETTING,
  MAX_MAX_FRAME_SIZE,
  MIN_MAX_FRAME_SIZE,
  PROTOCOL_VERSION,
  writeFrame,
  type Frame,
  type Int,
  type Settings,
} from "./frames.js";

export type Role = "client" | "server";
export type State = "AWAIT_HELLO" | "AWAIT_ACCEPT" | "AWAIT_WELCOME" | "OPEN" | "CLOSED";

/** Demand at or above this is unbounded (see the module comment). */
const UNBOUNDED = Number.MAX_SAFE_INTEGER;

type FrameEvent<F> = F extends { type: infer T } ? Omit<F, "type"> & { event: T } : never;

/** What `eventsReceived` reports: the peer's frames, items grouped per stream, and CLOSED. */
export type Event =
  | Exclude<FrameEvent<Frame>, { event: "NEXT" | "BATCH" | "PING" | "CONN_ERROR" }>
  // One per NEXT or BATCH frame; `nbytes` is the frame's size on the wire, for a receiver
  // that sizes its demand in bytes (the client's adaptive demand, demand.ts).
  | { event: "ITEMS"; stream_id: number; items: unknown[]; nbytes: number }
  | { event: "CLOSED"; code: Code | null; message: string; data: unknown; by_peer: boolean };

export interface ConnectionOptions {
  max_frame_size?: number;
  max_streams?: number;
  keepalive_interval?: number;
  auth_token?: string | Uint8Array;
  metadata?: Record<string, unknown>;
  /** Client: the versions its HELLO offers (default [1]; others only to test refusals). */
  versions?: Int[];
}

class Stream {
  accepted = false;
  constructor(
    readonly publishing: boolean,
    /** Publishing: items we may still send. Subscribing: items the peer may still send. */
    public demand: number,
  ) {}
}

function toDemand(n: Int): number {
  const value = Number(n);
  return value >= UNBOUNDED ? UNBOUNDED : value;
}

function addDemand(demand: number, n: Int): number {
  return demand >= UNBOUNDED ? UNBOUNDED : Math.min(demand + toDemand(n), UNBOUNDED);
}

function violation(message: string): ProtocolError {
  return new ProtocolError(ErrorCode.PROTOCOL_ERROR, message);
}

export class Connection {
  readonly role: Role;
  private _state: State;
  private readonly settings: Settings;
  private readonly maxFrameSize: number;
  private readonly scanner = new Scanner();
  private readonly reader = new FrameReader();
  private pending: Uint8Array | null = null; // bytes of an unfinished frame
  private out = new Encoder();
  private cuts: number[] = [];
  private messageStart = 0;
  private events: Event[] = [];
  private readonly streams = new Map<number, Stream>();
  private readonly parity: number;
  private nextId: number;
  private peerNextId: number;
  private localOpen = 0;
  private peerOpen = 0;
  private goAwaySent = false;
  private goAwayReceived = false;
  /** The negotiated version, once the handshake completed. */
  version: Int | null = null;
  /** The settings of the peer's HELLO or WELCOME. */
  peerSettings: Settings = {};
  /** Milliseconds between keepalives: this side's setting, the WELCOME's once open. */
  keepaliveInterval: number;
  private peerMaxFrameSize = MIN_MAX_FRAME_SIZE;
  private peerMaxStreams = DEFAULT_MAX_STREAMS;
  private readonly offered: Int[];

  constructor(role: Role, options: ConnectionOptions = {}) {
    const maxFrameSize = options.max_frame_size ?? DEFAULT_MAX_FRAME_SIZE;
    const maxStreams = options.max_streams ?? DEFAULT_MAX_STREAMS;
    const keepalive = options.keepalive_interval ?? DEFAULT_KEEPALIVE_INTERVAL;
    if (!Number.isInteger(maxFrameSize) || maxFrameSize < MIN_MAX_FRAME_SIZE || maxFrameSize > MAX_MAX_FRAME_SIZE) {
      throw new RangeError(`max_frame_size must be in ${MIN_MAX_FRAME_SIZE}..${MAX_MAX_FRAME_SIZE}`);
    }
    for (const value of [maxStreams, keepalive]) {
      if (!Number.isInteger(value) || value < 0 || value > MAX_SETTING) {
        throw new RangeError(`max_streams and keepalive_interval must be in 0..${MAX_SETTING}`);
      }
    }
    this.role = role;
    this._state = role === "client" ? "AWAIT_WELCOME" : "AWAIT_HELLO";
    this.maxFrameSize = maxFrameSize;
    this.settings = { max_frame_size: maxFrameSize, max_streams: maxStreams, keepalive_interval: keepalive };
    if (options.auth_token !== undefined) this.settings.auth_token = options.auth_token;
    if (options.metadata !== undefined) this.settings.metadata = checkMetadata(options.metadata);
    this.keepaliveInterval = keepalive;
    this.parity = role === "client" ? 1 : 0;
    this.nextId = role === "client" ? 1 : 2;
    this.peerNextId = role === "client" ? 2 : 1;
    this.offered = options.versions ?? [PROTOCOL_VERSION];
    if (role === "client") {
      this.write({ type: "HELLO", magic: MAGIC, versions: this.offered, settings: this.settings });
    }
  }

  // ------------------------------------------------------------------ inspection

  get state(): State {
    return this._state;
  }

  /** Streams currently open in either direction. */
  get streamCount(): number {
    return this.streams.size;
  }

  /** GO_AWAY was sent or received: no new streams. */
  get goingAway(): boolean {
    return this.goAwaySent || this.goAwayReceived;
  }

  /** Whether GO_AWAY was received from the peer. */
  get peerGoingAway(): boolean {
    return this.goAwayReceived;
  }

  /** This side's max_frame_size: no frame the peer sends can be larger. */
  get frameLimit(): number {
    return this.maxFrameSize;
  }

  /** The peer's max_frame_size (16384 until its settings arrived). */
  get peerFrameLimit(): number {
    return this.peerMaxFrameSize;
  }

  /** Items that may still flow on the stream (see `Stream.demand`); 0 once closed. */
  outstandingDemand(streamId: number): number {
    return this.streams.get(streamId)?.demand ?? 0;
  }

  /** Whether this side may open a stream now (SPEC 7.2): open, no GO_AWAY, below max_streams. */
  get canOpen(): boolean {
    return this._state === "OPEN" && !this.goingAway && this.localOpen < this.peerMaxStreams;
  }

  // ------------------------------------------------------------------ receiving

  /** Process received bytes; never throws for what the peer sent (see the module comment). */
  receiveData(data: Uint8Array): void {
    if (this._state === "CLOSED" || data.length === 0) return;
    if (this._state === "AWAIT_WELCOME" && this.pending === null && startsWithHttp(data)) {
      // A web server's answer (an HTTP port given for an rsnet one): say so.
      this.fail(ErrorCode.PROTOCOL_ERROR, "the server answered in HTTP, not the rsnet protocol: is it a web port?");
      return;
    }
    // A plain Uint8Array: binary items are copied out with its `slice` (a Node Buffer's is a view).
    let buf = data.constructor === Uint8Array ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    if (this.pending !== null) {
      buf = new Uint8Array(this.pending.length + data.length);
      buf.set(this.pending);
      buf.set(data, this.pending.length);
      this.pending = null;
    }
    const end = buf.length;
    const scanner = this.scanner;
    const limit = this.maxFrameSize;
    let start = 0;
    try {
      while (start < end) {
        if (buf[start] === 0x93 && this._state === "OPEN") {
          const binEnd = this.binItems(buf, start, end);
          if (binEnd > 0) {
            start = binEnd;
            if ((this._state as State) === "CLOSED") return;
            continue;
          }
        }
        scanner.reset(buf, end, start + limit);
        const frameEnd = scanner.scan(start);
        if (frameEnd < 0) {
          if (end - start >= limit) throw new ProtocolError(ErrorCode.FRAME_TOO_LARGE, `frame exceeds max_frame_size (${limit} bytes)`);
          this.pending = buf.slice(start, end);
          return;
        }
        if (frameEnd - start > limit) throw new ProtocolError(ErrorCode.FRAME_TOO_LARGE, `frame exceeds max_frame_size (${limit} bytes)`);
        const frame = this.reader.read(buf, start, frameEnd, scanner.flags);
        const size = frameEnd - start;
        start = frameEnd;
        if (frame !== null) this.receiveFrame(frame, size);
        if ((this._state as State) === "CLOSED") return; // receiveFrame may have closed it
      }
    } catch (error) {
      if (!(error instanceof ProtocolError)) throw error;
      this.fail(error.code, error.message);
    }
  }

  /**
   * The common frame read in one pass: a NEXT or BATCH of three fields whose items are all
   * bin 8, whole in `buf[start..end)` and within the frame limit. Returns its end, having
   * handled it as `dispatch` does, or 0 (nothing done) for any other frame, which the generic
   * path then scans and reads from `start`, finding whatever is wrong with it. Measured on
   * streams of 16-byte items (scenario 6): the generic path scans each frame, builds a Frame
   * object through the field layouts and decodes the items with msgpackr, and its functions
   * are deoptimized by the first frames of other kinds (a COMPLETE, the next stream's ACCEPT),
   * so a client's second stream ran at about half speed until V8 had compiled them again.
   */
  private binItems(buf: Uint8Array, start: number, end: number): number {
    const type = buf[start + 1];
    if ((type !== 0x15 && type !== 0x16) || start + 4 > end) return 0;
    // The stream id: a positive fixint, uint 8, 16 or 32.
    let p = start + 2;
    let id = buf[p];
    if (id <= 0x7f) p += 1;
    else if (id === 0xcc) {
      id = buf[p + 1];
      p += 2;
    } else if (id === 0xcd) {
      id = (buf[p + 1] << 8) | buf[p + 2];
      p += 3;
    } else if (id === 0xce) {
      id = buf[p + 1] * 0x1000000 + ((buf[p + 2] << 16) | (buf[p + 3] << 8) | buf[p + 4]);
      p += 5;
    } else return 0;
    if (id === 0 || p >= end) return 0;
    let items: Uint8Array[];
    if (type === 0x15) {
      if (buf[p] !== 0xc4 || p + 2 > end) return 0;
      const e = p + 2 + buf[p + 1];
      if (e > end) return 0;
      items = [buf.slice(p + 2, e)];
      p = e;
    } else {
      const b = buf[p];
      let n: number;
      if (b >= 0x90 && b <= 0x9f) {
        n = b & 0x0f;
        p += 1;
      } else if (b === 0xdc && p + 3 <= end) {
        n = (buf[p + 1] << 8) | buf[p + 2];
        p += 3;
      } else if (b === 0xdd && p + 5 <= end) {
        n = buf[p + 1] * 0x1000000 + ((buf[p + 2] << 16) | (buf[p + 3] << 8) | buf[p + 4]);
        p += 5;
      } else return 0;
      if (2 * n > end - p) return 0; // cannot all be here (2 bytes or more each): allocate nothing for a header
      items = new Array<Uint8Array>(n);
      for (let i = 0; i < n; i++) {
        if (p + 2 > end || buf[p] !== 0xc4) return 0;
        const e = p + 2 + buf[p + 1];
        if (e > end) return 0;
        // A copy (as msgpackr's `copyBuffers`): items must not alias the receive buffer.
        items[i] = buf.slice(p + 2, e);
        p = e;
      }
    }
    if (p - start > this.maxFrameSize) return 0; // FRAME_TOO_LARGE, from the generic path
    this.onItems(id, items, type === 0x15 ? "NEXT" : "BATCH", p - start);
    return p;
  }

  /** The transport reached end of file: the connection is over (SPEC 10.3). */
  receiveEof(): void {
    if (this._state === "CLOSED") return;
    let message = "connection closed";
    if (this.pending !== null) message = "connection closed in the middle of a frame";
    else if (this._state !== "OPEN") message = "connection closed during the handshake";
    else if (this.streams.size > 0) message = `connection closed with ${this.streams.size} stream(s) open`;
    this.close();
    this.events.push({ event: "CLOSED", code: null, message, data: null, by_peer: true });
  }

  /** The events since the last call, in the order the frames arrived. */
  eventsReceived(): Event[] {
    const events = this.events;
    this.events = [];
    return events;
  }

  // ------------------------------------------------------------------ output

  /** All bytes written since the last call (whole frames). */
  dataToSend(): Uint8Array {
    this.cuts = [];
    this.messageStart = 0;
    return this.out.take();
  }

  /** `dataToSend()` cut into WebSocket messages of whole frames, each within the peer's limit. */
  dataToSendMessages(): Uint8Array[] {
    const cuts = this.cuts;
    const data = this.dataToSend();
    const bounds = [0, ...cuts, data.length];
    const messages: Uint8Array[] = [];
    for (let i = 0; i + 1 < bounds.length; i++) {
      if (bounds[i + 1] > bounds[i]) messages.push(data.subarray(bounds[i], bounds[i + 1]));
    }
    return messages;
  }

  // ------------------------------------------------------------------ connection frames

  /** Server: accept the client's HELLO; the connection is open. */
  sendWelcome(metadata?: Record<string, unknown>): void {
    if (this._state !== "AWAIT_ACCEPT") throw violation(`WELCOME in state ${this._state}`);
    const settings: Settings = {
      max_frame_size: this.settings.max_frame_size,
      max_streams: this.settings.max_streams,
      keepalive_interval: this.settings.keepalive_interval,
    };
    if (metadata !== undefined) settings.metadata = checkMetadata(metadata);
    this.write({ type: "WELCOME", version: PROTOCOL_VERSION, settings });
    this._state = "OPEN";
  }

  /** Close with an error (or reject a HELLO); nothing is written after it. No event. */
  sendConnError(code: Code, message = "", data: unknown = null): void {
    if (this._state === "CLOSED") return;
    this.write({ type: "CONN_ERROR", code: checkCode(code), message, data });
    this.close();
  }

  sendPing(token: Int = 0): void {
    this.requireOpen();
    this.write({ type: "PING", token: checkUint(token, "token") });
  }

  /** Graceful shutdown: no new streams either way; open ones run to their end (SPEC 10.2). */
  sendGoAway(message = ""): void {
    this.requireOpen();
    if (!this.goAwaySent) {
      this.goAwaySent = true;
      this.write({ type: "GO_AWAY", message });
    }
  }

  // ------------------------------------------------------------------ opening streams

  /** Subscribe to the peer's publisher `name`; returns the new stream id. */
  sendSubscribe(name: string, params: unknown = null, initialDemand: Int = 0, metadata?: Record<string, unknown>): number {
    const streamId = this.allocate();
    let demand = checkUint(initialDemand, "initial_demand");
    if (demand > MAX_INT) demand = MAX_INT;
    this.write({ type: "SUBSCRIBE", stream_id: streamId, name: checkName(name), params, initial_demand: demand, metadata: checkMetadata(metadata) });
    this.open(streamId, false, toDemand(demand));
    return streamId;
  }

  /** Offer a publisher to the peer under `name`; returns the new stream id. */
  sendOffer(name: string, params: unknown = null, metadata?: Record<string, unknown>): number {
    const streamId = this.allocate();
    this.write({ type: "OFFER", stream_id: streamId, name: checkName(name), params, metadata: checkMetadata(metadata) });
    this.open(streamId, true, 0);
    return streamId;
  }

  /** Accept a stream the peer opened (the remote `onSubscribe`). */
  sendAccept(streamId: number, metadata?: Record<string, unknown>): void {
    const stream = this.streamForSend(streamId);
    if (stream === undefined) return;
    if (this.ours(streamId) || stream.accepted) throw violation(`stream ${streamId} cannot be accepted by this side`);
    this.write({ type: "ACCEPT", stream_id: streamId, metadata: checkMetadata(metadata) });
    stream.accepted = true;
  }

  // ------------------------------------------------------------------ subscriber side

  /**
   * Grant `n` more items (rule 3.8); demand saturates at 2^63-1, unbounded (3.17). Throws
   * `INVALID_REQUEST` for n <= 0: rule 3.9 is the local subscription's to signal, so such a
   * REQUEST never goes on the wire. A no-op on a closed stream (3.6).
   */
  sendRequest(streamId: number, n: Int): void {
    const stream = this.streamForSend(streamId);
    if (stream === undefined) return;
    if (stream.publishing || (!stream.accepted && !this.ours(streamId))) throw violation(`cannot REQUEST on stream ${streamId} now`);
    if ((typeof n !== "bigint" && !Number.isInteger(n)) || n <= 0) {
      throw new ProtocolError(ErrorCode.INVALID_REQUEST, `rule 3.9: request(${n}) must be positive`);
    }
    if (n > MAX_INT) n = MAX_INT;
    this.write({ type: "REQUEST", stream_id: streamId, n });
    stream.demand = addDemand(stream.demand, n);
  }

  /** Cancel the subscription (rule 3.12); a no-op once closed (rule 3.7). */
  sendCancel(streamId: number): void {
    const stream = this.streamForSend(streamId);
    if (stream === undefined) return;
    if (stream.publishing) throw violation(`the publisher side cannot CANCEL stream ${streamId}`);
    this.write({ type: "CANCEL", stream_id: streamId });
    this.closeStream(streamId);
  }

  // ------------------------------------------------------------------ publisher side

  /** Send one item on a stream we publish (NEXT). Throws as `sendBatch`; a no-op once closed. */
  sendNext(streamId: number, item: unknown): void {
    const stream = this.checkItems(streamId, [item]);
    if (stream === undefined) return;
    this.write({ type: "NEXT", stream_id: streamId, item });
    if (stream.demand < UNBOUNDED) stream.demand -= 1;
  }

  /**
   * Send items on a stream we publish, in as few BATCH frames as fit. All or nothing: throws
   * `FLOW_CONTROL` beyond the peer's demand (rule 1.1), `PROTOCOL_ERROR` for a nil item (2.13)
   * or before ACCEPT, `FRAME_TOO_LARGE` when one item alone exceeds the peer's frame limit.
   */
  sendBatch(streamId: number, items: unknown[]): void {
    const stream = this.checkItems(streamId, items);
    if (stream === undefined || items.length === 0) return;
    const mark = this.out.pos;
    const cuts = this.cuts.length;
    const messageStart = this.messageStart;
    try {
      this.writeBatch(streamId, items);
    } catch (error) {
      this.out.rewind(mark);
      this.cuts.length = cuts;
      this.messageStart = messageStart;
      throw error;
    }
    if (stream.demand < UNBOUNDED) stream.demand -= items.length;
  }

  private writeBatch(streamId: number, items: unknown[]): void {
    const start = this.out.pos;
    this.out.arrayHeader(3);
    this.out.int(22);
    this.out.int(streamId);
    this.out.arrayHeader(items.length);
    for (const item of items) this.out.value(item);
    const size = this.out.pos - start;
    if (size <= this.peerMaxFrameSize) {
      this.placed(start, size);
      return;
    }
    this.out.rewind(start);
    if (items.length === 1) {
      throw new ProtocolError(ErrorCode.FRAME_TOO_LARGE, `an item of ${size} bytes exceeds the peer's max_frame_size (${this.peerMaxFrameSize})`);
    }
    const half = items.length >> 1;
    this.writeBatch(streamId, items.slice(0, half));
    this.writeBatch(streamId, items.slice(half));
  }

  private checkItems(streamId: number, items: unknown[]): Stream | undefined {
    const stream = this.streamForSend(streamId);
    if (stream === undefined) return undefined;
    if (!stream.publishing || !stream.accepted) throw violation(`cannot send items on stream ${streamId} now`);
    if (items.some((item) => item === null || item === undefined)) {
      throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, "rule 2.13: items must not be null");
    }
    if (items.length > stream.demand) {
      throw new ProtocolError(ErrorCode.FLOW_CONTROL, `rule 1.1: the peer's outstanding demand on stream ${streamId} is ${stream.demand}`);
    }
    return stream;
  }

  /** Complete a stream we publish (rule 1.5); a no-op once closed. */
  sendComplete(streamId: number): void {
    const stream = this.streamForSend(streamId);
    if (stream === undefined) return;
    if (!stream.publishing || !stream.accepted) throw violation(`cannot COMPLETE stream ${streamId} now`);
    this.write({ type: "COMPLETE", stream_id: streamId });
    this.closeStream(streamId);
  }

  // ------------------------------------------------------------------ either side

  /** End a stream with an error (a remote onError, a rejection, or a cancel that says why). */
  sendError(streamId: number, code: Code, message = "", data: unknown = null): void {
    if (this.streamForSend(streamId) === undefined) return;
    this.write({ type: "ERROR", stream_id: streamId, code: checkCode(code), message, data });
    this.closeStream(streamId);
  }

  // ------------------------------------------------------------------ internals: sending

  private write(frame: Frame): void {
    const start = this.out.pos;
    try {
      writeFrame(this.out, frame);
    } catch (error) {
      this.out.rewind(start);
      throw new ProtocolError(ErrorCode.APPLICATION_ERROR, `not encodable as msgpack: ${(error as Error).message}`);
    }
    const size = this.out.pos - start;
    if (size > this.peerMaxFrameSize) {
      this.out.rewind(start);
      throw new ProtocolError(ErrorCode.FRAME_TOO_LARGE, `a ${size}-byte frame exceeds the peer's max_frame_size (${this.peerMaxFrameSize})`);
    }
    this.placed(start, size);
  }

  /** A frame of `size` bytes was written at `start`: start a new WebSocket message before it if needed. */
  private placed(start: number, size: number): void {
    if (start + size - this.messageStart > this.peerMaxFrameSize) {
      this.cuts.push(start);
      this.messageStart = start;
    }
  }

  private ours(streamId: number): boolean {
    return (streamId & 1) === this.parity;
  }

  private wasOpened(streamId: number): boolean {
    return streamId > 0 && streamId < (this.ours(streamId) ? this.nextId : this.peerNextId);
  }

  private streamForSend(streamId: number): Stream | undefined {
    const stream = this.streams.get(streamId);
    if (stream === undefined && !(Number.isInteger(streamId) && this.wasOpened(streamId))) {
      throw violation(`stream ${streamId} was never opened`);
    }
    return stream;
  }

  private allocate(): number {
    this.requireOpen();
    if (this.goingAway) throw new ProtocolError(ErrorCode.GOING_AWAY, "no new streams after GO_AWAY");
    if (this.localOpen >= this.peerMaxStreams) {
      throw new ProtocolError(ErrorCode.TOO_MANY_STREAMS, `the peer allows ${this.peerMaxStreams} concurrent streams`);
    }
    if (this.nextId > Number.MAX_SAFE_INTEGER) throw violation("stream ids exhausted: open a new connection");
    return this.nextId;
  }

  private open(streamId: number, publishing: boolean, demand: number): void {
    this.streams.set(streamId, new Stream(publishing, demand));
    if (this.ours(streamId)) {
      this.nextId += 2;
      this.localOpen += 1;
    } else this.peerOpen += 1;
  }

  private closeStream(streamId: number): void {
    this.streams.delete(streamId);
    if (this.ours(streamId)) this.localOpen -= 1;
    else this.peerOpen -= 1;
  }

  private close(): void {
    this._state = "CLOSED";
    this.streams.clear();
    this.localOpen = this.peerOpen = 0;
    this.pending = null;
  }

  private requireOpen(): void {
    if (this._state !== "OPEN") throw violation(`the connection is ${this._state}`);
  }

  // ------------------------------------------------------------------ internals: receiving

  /** One received frame of `size` bytes. */
  private receiveFrame(frame: Frame, size: number): void {
    if (this._state === "OPEN") return this.dispatch(frame, size);
    if (frame.type === "CONN_ERROR") return this.onConnError(frame);
    if (this._state === "AWAIT_HELLO" && frame.type === "HELLO") return this.onHello(frame);
    if (this._state === "AWAIT_WELCOME" && frame.type === "WELCOME") return this.onWelcome(frame);
    throw violation(`${frame.type} in state ${this._state}`);
  }

  private dispatch(frame: Frame, size: number): void {
    switch (frame.type) {
      case "HELLO":
      case "WELCOME":
        throw violation(`${frame.type} after the handshake`);
      case "PING":
        return this.write({ type: "PONG", token: frame.token });
      case "PONG":
        this.events.push({ event: "PONG", token: frame.token });
        return;
      case "GO_AWAY":
        if (!this.goAwayReceived) {
          this.goAwayReceived = true;
          this.events.push({ event: "GO_AWAY", message: frame.message });
        }
        return;
      case "CONN_ERROR":
        return this.onConnError(frame);
      case "SUBSCRIBE":
      case "OFFER":
        return this.onOpen(frame);
      case "ACCEPT": {
        const stream = this.peerStream(frame.stream_id);
        if (stream === undefined) return;
        if (!this.ours(frame.stream_id) || stream.accepted) throw violation(`ACCEPT for stream ${frame.stream_id}, which the peer cannot accept`);
        stream.accepted = true;
        this.events.push({ event: "ACCEPT", stream_id: frame.stream_id, metadata: frame.metadata });
        return;
      }
      case "REQUEST": {
        const stream = this.peerStream(frame.stream_id);
        if (stream === undefined) return;
        if (!stream.publishing || (!stream.accepted && this.ours(frame.stream_id))) {
          throw violation(`REQUEST on stream ${frame.stream_id}, where the peer may not request`);
        }
        if (frame.n <= 0) return this.streamError(frame.stream_id, ErrorCode.INVALID_REQUEST, `rule 3.9: request(${frame.n}) is not positive`);
        stream.demand = addDemand(stream.demand, frame.n);
        this.events.push({ event: "REQUEST", stream_id: frame.stream_id, n: frame.n });
        return;
      }
      case "CANCEL": {
        const stream = this.peerStream(frame.stream_id);
        if (stream === undefined) return;
        if (!stream.publishing) throw violation(`CANCEL from the publisher side of stream ${frame.stream_id}`);
        this.closeStream(frame.stream_id);
        this.events.push({ event: "CANCEL", stream_id: frame.stream_id });
        return;
      }
      case "NEXT":
        return this.onItems(frame.stream_id, [frame.item], "NEXT", size);
      case "BATCH":
        return this.onItems(frame.stream_id, frame.items, "BATCH", size);
      case "COMPLETE":
        if (this.itemsStream(frame.stream_id, "COMPLETE") !== undefined) {
          this.closeStream(frame.stream_id);
          this.events.push({ event: "COMPLETE", stream_id: frame.stream_id });
        }
        return;
      case "ERROR":
        if (this.peerStream(frame.stream_id) !== undefined) {
          this.closeStream(frame.stream_id);
          const { type: _, ...fields } = frame;
          this.events.push({ event: "ERROR", ...fields });
        }
        return;
    }
  }

  private fail(code: number, message: string, data: unknown = null): void {
    this.write({ type: "CONN_ERROR", code, message, data });
    this.close();
    this.events.push({ event: "CLOSED", code, message, data, by_peer: false });
  }

  private streamError(streamId: number, code: number, message: string): void {
    this.write({ type: "ERROR", stream_id: streamId, code, message, data: null });
    this.closeStream(streamId);
    this.events.push({ event: "ERROR", stream_id: streamId, code, message, data: null });
  }

  private onHello(hello: Extract<Frame, { type: "HELLO" }>): void {
    if (!hello.versions.some((v) => v === PROTOCOL_VERSION)) {
      this.fail(ErrorCode.UNSUPPORTED_VERSION, `no common version: offered [${hello.versions.join(", ")}], supported [${PROTOCOL_VERSION}]`, {
        versions: [PROTOCOL_VERSION],
      });
      return;
    }
    // The server decides the keepalive interval: its own setting, whatever the client proposed.
    this.handshake(PROTOCOL_VERSION, hello.settings, this.keepaliveInterval);
    this._state = "AWAIT_ACCEPT";
    this.events.push({ event: "HELLO", magic: hello.magic, versions: hello.versions, settings: hello.settings });
  }

  private onWelcome(welcome: Extract<Frame, { type: "WELCOME" }>): void {
    if (welcome.version !== PROTOCOL_VERSION || !this.offered.includes(welcome.version)) throw violation(`WELCOME chose version ${welcome.version}, which was not offered`);
    this.handshake(welcome.version, welcome.settings, welcome.settings.keepalive_interval ?? DEFAULT_KEEPALIVE_INTERVAL);
    this._state = "OPEN";
    this.events.push({ event: "WELCOME", version: welcome.version, settings: welcome.settings });
  }

  private handshake(version: Int, settings: Settings, keepalive: number): void {
    this.version = version;
    this.peerSettings = settings;
    this.keepaliveInterval = keepalive;
    this.peerMaxStreams = settings.max_streams ?? DEFAULT_MAX_STREAMS;
    this.peerMaxFrameSize = settings.max_frame_size ?? DEFAULT_MAX_FRAME_SIZE;
  }

  private onConnError(frame: Extract<Frame, { type: "CONN_ERROR" }>): void {
    this.close();
    this.events.push({ event: "CLOSED", code: frame.code, message: frame.message, data: frame.data, by_peer: true });
  }

  private onOpen(frame: Extract<Frame, { type: "SUBSCRIBE" | "OFFER" }>): void {
    const streamId = frame.stream_id;
    if (streamId !== this.peerNextId) throw violation(`${frame.type} opened stream ${streamId}, expected ${this.peerNextId}`);
    if (this.goAwayReceived) throw violation(`${frame.type} after the peer's own GO_AWAY`);
    this.peerNextId += 2;
    // Refusals are stream errors the connection answers itself; the id is used up anyway.
    if (this.goAwaySent) {
      this.write({ type: "ERROR", stream_id: streamId, code: ErrorCode.GOING_AWAY, message: "going away: retry on a new connection", data: null });
    } else if (this.peerOpen >= (this.settings.max_streams as number)) {
      this.write({ type: "ERROR", stream_id: streamId, code: ErrorCode.TOO_MANY_STREAMS, message: "too many concurrent streams", data: null });
    } else {
      const publishing = frame.type === "SUBSCRIBE";
      this.open(streamId, publishing, publishing ? toDemand(frame.initial_demand) : 0);
      const { type, ...fields } = frame;
      this.events.push({ event: type, ...fields } as Event);
    }
  }

  /** The open stream a received frame is for; undefined if it has ended (drop the frame). */
  private peerStream(streamId: number): Stream | undefined {
    const stream = this.streams.get(streamId);
    if (stream === undefined && !(typeof streamId === "number" && this.wasOpened(streamId))) {
      throw violation(`frame for stream ${streamId}, which was never opened`);
    }
    return stream;
  }

  private itemsStream(streamId: number, kind: string): Stream | undefined {
    const stream = this.peerStream(streamId);
    if (stream !== undefined && (stream.publishing || !stream.accepted)) {
      throw violation(`${kind} on stream ${streamId}, where the peer may not send it`);
    }
    return stream;
  }

  private onItems(streamId: number, items: unknown[], kind: string, nbytes: number): void {
    const stream = this.itemsStream(streamId, kind);
    if (stream === undefined) return;
    for (const item of items) {
      if (item === null) return this.streamError(streamId, ErrorCode.PROTOCOL_ERROR, "rule 2.13: an item is nil");
    }
    if (items.length > stream.demand) {
      return this.streamError(streamId, ErrorCode.FLOW_CONTROL, `rule 1.1: ${items.length} items with ${stream.demand} outstanding demand`);
    }
    if (stream.demand < UNBOUNDED) stream.demand -= items.length;
    this.events.push({ event: "ITEMS", stream_id: streamId, items, nbytes });
  }
}

function checkUint(value: Int, name: string): Int {
  if ((typeof value !== "bigint" && !Number.isInteger(value)) || value < 0 || value > MAX_INT) {
    throw violation(`${name} must be an integer in 0..2**63-1, got ${value}`);
  }
  return value;
}

function checkCode(code: Code): Code {
  return checkUint(code, "an error code");
}

function checkName(name: string): string {
  if (typeof name !== "string") throw violation(`a stream name must be a string, got ${typeof name}`);
  return name;
}

function checkMetadata(metadata: Record<string, unknown> | undefined): Record<string, unknown> {
  if (metadata === undefined || metadata === null) return {};
  if (typeof metadata !== "object" || Array.isArray(metadata) || metadata instanceof Map || ArrayBuffer.isView(metadata)) {
    throw violation("metadata must be a plain object (string keys)");
  }
  return metadata;
}

/** Whether `data` begins as an HTTP response does ("HTTP/"). */
function startsWithHttp(data: Uint8Array): boolean {
  const http = [0x48, 0x54, 0x54, 0x50, 0x2f];
  return data.length >= http.length && http.every((byte, i) => data[i] === byte);
}

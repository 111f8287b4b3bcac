/**
 * The frames of wire protocol v1 (protocol/SPEC.md section 4): layouts, reading and writing.
 *
 * A frame is a msgpack array `[type, field1, ...]`. Frame objects here use the field names of
 * SPEC section 4 (as the golden vectors do), with `type` as the frame's name. Reading works on
 * the bytes of one whole, already scanned frame: integer fields are read from their msgpack
 * encoding, so a float or a boolean is refused where an integer is required (SPEC 3: `21.0`
 * is not the frame type 21), which a decoded JS number could not tell. Fields of type `any`
 * and items are decoded by the codec.
 */
import { decodeRange, Encoder, Scanner, normalize } from "./codec.js";
import { ErrorCode, ProtocolError, type Code } from "./errors.js";

export const PROTOCOL_VERSION = 1;
export const MAGIC = "rsnet";
/** Largest integer in any protocol field; as demand it means unbounded (rule 3.17). */
export const MAX_INT = (1n << 63n) - 1n;
export const DEFAULT_MAX_FRAME_SIZE = 1 << 20;
export const MIN_MAX_FRAME_SIZE = 16384;
export const MAX_MAX_FRAME_SIZE = 2 ** 31 - 1;
export const DEFAULT_MAX_STREAMS = 1024;
export const DEFAULT_KEEPALIVE_INTERVAL = 20000;
export const MAX_SETTING = 2 ** 31 - 1;
export const MAX_VERSIONS = 16;
export const FIRST_EXTENSION_TYPE = 64;

/** A protocol integer: a number when it is a safe integer, else a bigint. */
export type Int = number | bigint;

export interface Settings {
  max_frame_size?: number;
  max_streams?: number;
  keepalive_interval?: number;
  auth_token?: string | Uint8Array;
  metadata?: Record<string, unknown>;
  [key: string]: unknown;
}

export type Frame =
  | { type: "HELLO"; magic: string; versions: Int[]; settings: Settings }
  | { type: "WELCOME"; version: Int; settings: Settings }
  | { type: "PING"; token: Int }
  | { type: "PONG"; token: Int }
  | { type: "GO_AWAY"; message: string }
  | { type: "CONN_ERROR"; code: Code; message: string; data: unknown }
  | { type: "SUBSCRIBE"; stream_id: number; name: string; params: unknown; initial_demand: Int; metadata: Record<string, unknown> }
  | { type: "OFFER"; stream_id: number; name: string; params: unknown; metadata: Record<string, unknown> }
  | { type: "ACCEPT"; stream_id: number; metadata: Record<string, unknown> }
  | { type: "REQUEST"; stream_id: number; n: Int }
  | { type: "CANCEL"; stream_id: number }
  | { type: "NEXT"; stream_id: number; item: unknown }
  | { type: "BATCH"; stream_id: number; items: unknown[] }
  | { type: "COMPLETE"; stream_id: number }
  | { type: "ERROR"; stream_id: number; code: Code; message: string; data: unknown };

export type FrameName = Frame["type"];

type Kind = "uint" | "id" | "int64" | "str" | "any" | "map" | "items" | "magic" | "versions" | "settings";

/** Frame type number, name and field layout (SPEC 4.1, 4.2). */
export const LAYOUTS: Record<FrameName, { code: number; fields: [string, Kind][] }> = {
  HELLO: { code: 1, fields: [["magic", "magic"], ["versions", "versions"], ["settings", "settings"]] },
  WELCOME: { code: 2, fields: [["version", "id"], ["settings", "settings"]] },
  PING: { code: 3, fields: [["token", "uint"]] },
  PONG: { code: 4, fields: [["token", "uint"]] },
  GO_AWAY: { code: 5, fields: [["message", "str"]] },
  CONN_ERROR: { code: 6, fields: [["code", "uint"], ["message", "str"], ["data", "any"]] },
  SUBSCRIBE: {
    code: 16,
    fields: [["stream_id", "id"], ["name", "str"], ["params", "any"], ["initial_demand", "uint"], ["metadata", "map"]],
  },
  OFFER: { code: 17, fields: [["stream_id", "id"], ["name", "str"], ["params", "any"], ["metadata", "map"]] },
  ACCEPT: { code: 18, fields: [["stream_id", "id"], ["metadata", "map"]] },
  REQUEST: { code: 19, fields: [["stream_id", "id"], ["n", "int64"]] },
  CANCEL: { code: 20, fields: [["stream_id", "id"]] },
  NEXT: { code: 21, fields: [["stream_id", "id"], ["item", "any"]] },
  BATCH: { code: 22, fields: [["stream_id", "id"], ["items", "items"]] },
  COMPLETE: { code: 23, fields: [["stream_id", "id"]] },
  ERROR: { code: 24, fields: [["stream_id", "id"], ["code", "uint"], ["message", "str"], ["data", "any"]] },
};

const BY_CODE = new Map<number, FrameName>(
  (Object.keys(LAYOUTS) as FrameName[]).map((name) => [LAYOUTS[name].code, name]),
);

const BOUNDED: Record<string, [number, number]> = {
  max_frame_size: [MIN_MAX_FRAME_SIZE, MAX_MAX_FRAME_SIZE],
  max_streams: [0, MAX_SETTING],
  keepalive_interval: [0, MAX_SETTING],
};

function fail(name: string, what: string): ProtocolError {
  return new ProtocolError(ErrorCode.PROTOCOL_ERROR, `${name} must be ${what}`);
}

const text = new TextDecoder();

/** Reads the fields of one whole frame from its bytes (see the module comment). */
export class FrameReader {
  private buf: Uint8Array = new Uint8Array(0);
  private view: DataView = new DataView(new ArrayBuffer(0));
  private pos = 0;
  private end = 0;
  private flags = 0;
  private readonly skipper = new Scanner();
  /** The integer the last successful `int()` read. */
  private value: Int = 0;

  /** Points the reader at a new receive buffer. */
  private use(buf: Uint8Array): void {
    if (buf !== this.buf) {
      this.buf = buf;
      this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    }
  }

  /**
   * Parse the frame in `buf[start..end)` (`flags`: the scanner's flags for it). Returns null
   * for an extension frame (type >= 64), which the receiver ignores (SPEC 5).
   */
  read(buf: Uint8Array, start: number, end: number, flags: number): Frame | null {
    this.use(buf);
    this.pos = start;
    this.end = end;
    this.flags = flags;
    const count = this.arrayHeader();
    if (count < 1) throw fail("a frame", "a non-empty array");
    if (!this.int()) throw fail("the frame type", "an integer in 0..2**63-1");
    const code = this.value;
    if (code < 0) throw fail("the frame type", "an integer in 0..2**63-1");
    const name = typeof code === "number" ? BY_CODE.get(code) : undefined;
    if (name === undefined) {
      if (code >= FIRST_EXTENSION_TYPE) return null;
      throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, `unknown frame type ${code}`);
    }
    const fields = LAYOUTS[name].fields;
    if (count - 1 < fields.length) {
      throw new ProtocolError(ErrorCode.PROTOCOL_ERROR, `${name} needs ${fields.length} fields, got ${count - 1}`);
    }
    const trailing = count - 1 > fields.length;
    const frame: Record<string, unknown> = { type: name };
    for (let i = 0; i < fields.length; i++) {
      const [field, kind] = fields[i];
      const last = i === fields.length - 1 && !trailing;
      frame[field] = this.field(kind, `${name}.${field}`, last);
    }
    return frame as Frame;
  }

  private arrayHeader(): number {
    const b = this.buf[this.pos];
    if (b >= 0x90 && b <= 0x9f) {
      this.pos += 1;
      return b & 0x0f;
    }
    if (b === 0xdc) {
      this.pos += 3;
      return this.view.getUint16(this.pos - 2);
    }
    if (b === 0xdd) {
      this.pos += 5;
      return this.view.getUint32(this.pos - 4);
    }
    return -1;
  }

  private mapHeader(): number {
    const b = this.buf[this.pos];
    if (b >= 0x80 && b <= 0x8f) {
      this.pos += 1;
      return b & 0x0f;
    }
    if (b === 0xde) {
      this.pos += 3;
      return this.view.getUint16(this.pos - 2);
    }
    if (b === 0xdf) {
      this.pos += 5;
      return this.view.getUint32(this.pos - 4);
    }
    return -1;
  }

  /** Reads an integer into `value` and returns true, or returns false (nothing consumed). */
  private int(): boolean {
    const b = this.buf[this.pos];
    const v = this.view;
    const p = this.pos + 1;
    if (b <= 0x7f) {
      this.value = b;
      this.pos = p;
      return true;
    }
    if (b >= 0xe0) {
      this.value = b - 0x100;
      this.pos = p;
      return true;
    }
    switch (b) {
      case 0xcc:
        this.value = v.getUint8(p);
        this.pos = p + 1;
        return true;
      case 0xcd:
        this.value = v.getUint16(p);
        this.pos = p + 2;
        return true;
      case 0xce:
        this.value = v.getUint32(p);
        this.pos = p + 4;
        return true;
      case 0xcf:
        this.value = normalize(v.getBigUint64(p));
        this.pos = p + 8;
        return true;
      case 0xd0:
        this.value = v.getInt8(p);
        this.pos = p + 1;
        return true;
      case 0xd1:
        this.value = v.getInt16(p);
        this.pos = p + 2;
        return true;
      case 0xd2:
        this.value = v.getInt32(p);
        this.pos = p + 4;
        return true;
      case 0xd3:
        this.value = normalize(v.getBigInt64(p));
        this.pos = p + 8;
        return true;
    }
    return false;
  }

  private str(): string | null {
    const b = this.buf[this.pos];
    let n: number;
    let p = this.pos + 1;
    if (b >= 0xa0 && b <= 0xbf) n = b & 0x1f;
    else if (b === 0xd9) n = this.buf[p++];
    else if (b === 0xda) {
      n = this.view.getUint16(p);
      p += 2;
    } else if (b === 0xdb) {
      n = this.view.getUint32(p);
      p += 4;
    } else return null;
    this.pos = p + n;
    return text.decode(this.buf.subarray(p, p + n));
  }

  /** Decode the next value (to the frame's end when `last`). */
  private any(last: boolean): unknown {
    const start = this.pos;
    if (last) {
      this.pos = this.end;
      return decodeRange(this.buf, start, this.end, this.flags);
    }
    this.skipper.reset(this.buf, this.end, this.end);
    this.pos = this.skipper.scan(start);
    return decodeRange(this.buf, start, this.pos, this.skipper.flags);
  }

  private bounded(name: string, low: Int, high: Int): Int {
    if (!this.int() || this.value < low || this.value > high) throw fail(name, `an integer in ${low}..${high}`);
    return this.value;
  }

  private map(name: string, last: boolean): Record<string, unknown> {
    const b = this.buf[this.pos];
    const isMap = (b >= 0x80 && b <= 0x8f) || b === 0xde || b === 0xdf;
    const value = isMap ? this.any(last) : undefined;
    if (!isMap || value instanceof Map) throw fail(name, "a map with string keys");
    return value as Record<string, unknown>;
  }

  private field(kind: Kind, name: string, last: boolean): unknown {
    switch (kind) {
      case "uint":
        return this.bounded(name, 0, MAX_INT);
      case "id":
        return this.bounded(name, 1, MAX_INT);
      case "int64":
        return this.bounded(name, -MAX_INT - 1n, MAX_INT);
      case "str":
      case "magic": {
        const s = this.str();
        if (s === null) throw fail(name, "a string");
        if (kind === "magic" && s !== MAGIC) throw fail(name, JSON.stringify(MAGIC));
        return s;
      }
      case "any":
        return this.any(last);
      case "map":
        return this.map(name, last);
      case "items": {
        const b = this.buf[this.pos];
        if (!((b >= 0x90 && b <= 0x9f) || b === 0xdc || b === 0xdd)) throw fail(name, "an array");
        return this.any(last);
      }
      case "versions": {
        const n = this.arrayHeader();
        if (n < 1 || n > MAX_VERSIONS) throw fail(name, `an array of 1..${MAX_VERSIONS} versions`);
        const versions: Int[] = [];
        for (let i = 0; i < n; i++) versions.push(this.bounded(name, 1, MAX_INT));
        return versions;
      }
      case "settings":
        return this.settings(name);
    }
  }

  private settings(name: string): Settings {
    const n = this.mapHeader();
    if (n < 0) throw fail(name, "a map with string keys");
    const settings: Settings = {};
    for (let i = 0; i < n; i++) {
      const key = this.str();
      if (key === null) throw fail(name, "a map with string keys");
      const where = `${name}.${key}`;
      const range = BOUNDED[key];
      let value: unknown;
      if (range !== undefined) value = this.bounded(where, range[0], range[1]);
      else if (key === "metadata") value = this.map(where, false);
      else {
        value = this.any(false);
        if (key === "auth_token" && typeof value !== "string" && !(value instanceof Uint8Array)) {
          throw fail(where, "a string or binary");
        }
      }
      Object.defineProperty(settings, key, { value, enumerable: true, writable: true, configurable: true });
    }
    return settings;
  }
}

/** Append the encoding of `frame` to `out`. Fields are written as given (no validation). */
export function writeFrame(out: Encoder, frame: Frame): void {
  const layout = LAYOUTS[frame.type];
  const record = frame as unknown as Record<string, unknown>;
  out.arrayHeader(layout.fields.length + 1);
  out.int(layout.code);
  for (const [field, kind] of layout.fields) {
    const value = record[field];
    if (kind === "uint" || kind === "id" || kind === "int64") out.int(value as Int);
    else if (kind === "settings") writeSettings(out, value as Settings);
    else out.value(value);
  }
}

function writeSettings(out: Encoder, settings: Settings): void {
  const keys = Object.keys(settings).filter((k) => settings[k] !== undefined);
  out.mapHeader(keys.length);
  for (const key of keys) {
    out.str(key);
    if (key in BOUNDED) out.int(settings[key] as number);
    else out.value(settings[key]);
  }
}

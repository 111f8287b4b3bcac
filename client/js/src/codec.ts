/**
 * msgpack for the rsnet wire protocol (protocol/SPEC.md sections 2 and 3).
 *
 * - `scanValue` walks one msgpack value's structure without building it: it finds where a
 *   frame ends in a byte stream (frames have no length prefix), enforces the frame size limit
 *   from length headers before the bytes arrive (SPEC 2.1), the nesting limit, the map-key rule
 *   and UTF-8 validity (SPEC 3), and notes what the fast decoder cannot represent.
 * - Values are decoded by msgpackr (measured about 5x faster than @msgpack/msgpack on BATCH
 *   items, see README), with integers beyond 2^53 as `bigint` (`int64AsType: "auto"`). The rare
 *   values msgpackr would get wrong (ext values, which it refuses unless registered globally,
 *   maps with binary keys, and the key "__proto__", which it renames) are decoded by
 *   `SlowDecoder` below.
 * - Encoding is our own `Encoder`: both libraries encode integral numbers >= 2^32 as float64
 *   in their BigInt modes, and the server rightly rejects a float where an integer is
 *   required. Ours writes the shortest encoding of every value, as the golden vectors expect.
 *
 * No I/O here: this module only turns bytes into values and back.
 */
import { Unpackr } from "msgpackr";

import { ErrorCode, ProtocolError } from "./errors.js";

/** An ext value (msgpack type `type`, its raw bytes); decoded and encoded unchanged. */
export class Ext {
  constructor(
    readonly type: number,
    readonly data: Uint8Array,
  ) {}
}

/**
 * A number to encode as float64 even when it is whole: JS has one number type, so `12.0` is
 * the integer 12 to the encoder unless wrapped (`new Float64(12)`). Decoding cannot tell them
 * apart either: a whole float received is a plain `number`.
 */
export class Float64 {
  constructor(readonly value: number) {}
}

export const MAX_DEPTH = 512;
const MAX_INT64 = (1n << 63n) - 1n;
const MIN_INT64 = -(1n << 63n);
const MAX_UINT64 = (1n << 64n) - 1n;
const TWO_32 = 4294967296;

const utf8 = new TextDecoder("utf-8", { fatal: true });
const utf8Encoder = new TextEncoder();

function violation(message: string): ProtocolError {
  return new ProtocolError(ErrorCode.PROTOCOL_ERROR, message);
}

/** Flags `scanValue` reports: what the fast decoder must not be given. */
export const HAS_EXT = 1;
export const HAS_BIN_KEY = 2;
/** A map key "__proto__", which msgpackr renames to "__proto_" (a guard of its own). */
export const HAS_PROTO_KEY = 4;
const PROTO = [0xa9, ...Array.from("__proto__", (c) => c.charCodeAt(0))];

/**
 * Structural scanner over `buf[pos..end)`, for one value that must end before `limit`.
 * `scan(pos)` returns the offset after the value, or -1 when the bytes end first. It throws
 * `FRAME_TOO_LARGE` as soon as a length header proves the value cannot end before `limit`,
 * and `PROTOCOL_ERROR` for bytes that are not msgpack, invalid UTF-8, a map key that is not
 * str or bin, or nesting deeper than `MAX_DEPTH`.
 */
export class Scanner {
  buf: Uint8Array = new Uint8Array(0);
  end = 0;
  limit = 0;
  flags = 0;
  private view: DataView = new DataView(new ArrayBuffer(0));

  reset(buf: Uint8Array, end: number, limit: number): void {
    if (buf !== this.buf) {
      this.buf = buf;
      this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    }
    this.end = end;
    this.limit = limit;
    this.flags = 0;
  }

  private length(pos: number, size: number): number {
    const v = this.view;
    return size === 1 ? v.getUint8(pos) : size === 2 ? v.getUint16(pos) : v.getUint32(pos);
  }

  /** Checks that `count` bytes starting at `pos` can still end before the limit. */
  private fits(pos: number, count: number): void {
    if (pos + count > this.limit) {
      throw new ProtocolError(ErrorCode.FRAME_TOO_LARGE, `a length header (${count}) exceeds max_frame_size`);
    }
  }

  /** Returns the end of the value at `pos`, or -1 if incomplete. `depth` counts this value. */
  scan(pos: number, depth = 1): number {
    if (depth > MAX_DEPTH) throw violation(`values nest deeper than ${MAX_DEPTH} levels`);
    if (pos >= this.end) return -1;
    const b = this.buf[pos];
    if (b <= 0x7f || b >= 0xe0 || (b >= 0xc0 && b <= 0xc3)) {
      if (b === 0xc1) throw violation("bytes are not msgpack (0xc1)");
      return pos + 1;
    }
    if (b <= 0x8f) return this.scanMap(pos + 1, b & 0x0f, depth);
    if (b <= 0x9f) return this.scanArray(pos + 1, b & 0x0f, depth);
    if (b <= 0xbf) return this.scanStr(pos + 1, b & 0x1f);
    let header: number;
    switch (b) {
      case 0xc4:
      case 0xc5:
      case 0xc6: {
        header = b === 0xc4 ? 1 : b === 0xc5 ? 2 : 4;
        if (pos + 1 + header > this.end) return this.incomplete(pos + 1 + header);
        const n = this.length(pos + 1, header);
        this.fits(pos + 1 + header, n);
        const e = pos + 1 + header + n;
        return e > this.end ? -1 : e;
      }
      case 0xc7:
      case 0xc8:
      case 0xc9: {
        header = b === 0xc7 ? 1 : b === 0xc8 ? 2 : 4;
        if (pos + 2 + header > this.end) return this.incomplete(pos + 2 + header);
        const n = this.length(pos + 1, header);
        this.fits(pos + 2 + header, n);
        this.flags |= HAS_EXT;
        const e = pos + 2 + header + n;
        return e > this.end ? -1 : e;
      }
      case 0xca:
        return this.fixed(pos, 5);
      case 0xcb:
        return this.fixed(pos, 9);
      case 0xcc:
      case 0xd0:
        return this.fixed(pos, 2);
      case 0xcd:
      case 0xd1:
        return this.fixed(pos, 3);
      case 0xce:
      case 0xd2:
        return this.fixed(pos, 5);
      case 0xcf:
      case 0xd3:
        return this.fixed(pos, 9);
      case 0xd4:
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8:
        this.flags |= HAS_EXT;
        return this.fixed(pos, 2 + (1 << (b - 0xd4)));
      case 0xd9:
      case 0xda:
      case 0xdb: {
        header = b === 0xd9 ? 1 : b === 0xda ? 2 : 4;
        if (pos + 1 + header > this.end) return this.incomplete(pos + 1 + header);
        return this.scanStr(pos + 1 + header, this.length(pos + 1, header));
      }
      case 0xdc:
      case 0xdd:
      case 0xde:
      case 0xdf: {
        header = b === 0xdc || b === 0xde ? 2 : 4;
        if (pos + 1 + header > this.end) return this.incomplete(pos + 1 + header);
        const n = this.length(pos + 1, header);
        return b <= 0xdd ? this.scanArray(pos + 1 + header, n, depth) : this.scanMap(pos + 1 + header, n, depth);
      }
    }
    throw violation(`bytes are not msgpack (0x${b.toString(16)})`);
  }

  private incomplete(needed: number): number {
    if (needed > this.limit) throw new ProtocolError(ErrorCode.FRAME_TOO_LARGE, "frame exceeds max_frame_size");
    return -1;
  }

  private fixed(pos: number, size: number): number {
    const e = pos + size;
    return e > this.end ? this.incomplete(e) : e;
  }

  private scanStr(pos: number, n: number): number {
    this.fits(pos, n);
    const e = pos + n;
    if (e > this.end) return -1;
    const buf = this.buf;
    for (let i = pos; i < e; i++) {
      if (buf[i] > 0x7f) {
        try {
          utf8.decode(buf.subarray(pos, e));
        } catch {
          throw violation("a string is not valid UTF-8");
        }
        break;
      }
    }
    return e;
  }

  private scanArray(pos: number, n: number, depth: number): number {
    this.fits(pos, n); // every element takes at least one byte
    const buf = this.buf;
    const inline = depth < MAX_DEPTH; // an element may nest one level deeper
    for (let i = 0; i < n; i++) {
      if (inline && buf[pos] === 0xc4 && pos + 1 < this.end) {
        // A bin 8 element, as scan() reads it, without the call: the common BATCH (short byte
        // strings) scans in about half the time.
        const size = buf[pos + 1];
        this.fits(pos + 2, size);
        pos += 2 + size;
        if (pos > this.end) return -1;
        continue;
      }
      pos = this.scan(pos, depth + 1);
      if (pos < 0) return -1;
    }
    return pos;
  }

  private scanMap(pos: number, n: number, depth: number): number {
    this.fits(pos, 2 * n);
    for (let i = 0; i < n; i++) {
      if (pos >= this.end) return -1;
      const k = this.buf[pos];
      const isStr = (k >= 0xa0 && k <= 0xbf) || (k >= 0xd9 && k <= 0xdb);
      if (!isStr) {
        if (k >= 0xc4 && k <= 0xc6) this.flags |= HAS_BIN_KEY;
        else throw violation("map keys must be strings or binary");
      } else if (k === 0xa9 && pos + 10 <= this.end && PROTO.every((b, i) => this.buf[pos + i] === b)) {
        this.flags |= HAS_PROTO_KEY;
      }
      pos = this.scan(pos, depth + 1);
      if (pos < 0) return -1;
      pos = this.scan(pos, depth + 1);
      if (pos < 0) return -1;
    }
    return pos;
  }
}

// msgpackr supports "auto" (numbers when exact, else bigint) but its types do not list it yet.
const fast = new Unpackr({
  int64AsType: "auto" as "bigint",
  mapsAsObjects: true,
  useRecords: false,
  copyBuffers: true, // decoded binary values must not alias the receive buffer
});

/** Decode the (already scanned) value in `buf[start..end)`; `flags` from the scan. */
export function decodeRange(buf: Uint8Array, start: number, end: number, flags: number): unknown {
  if (flags === 0) return fast.unpack(buf, { start, end });
  return new SlowDecoder(buf, start).read();
}

/**
 * Decoder for values with ext or binary map keys (already validated by the scanner): ext
 * values become `Ext`, a map with a binary key becomes a `Map` (keys string or Uint8Array),
 * every other map a plain object, integers beyond 2^53 `bigint`.
 */
class SlowDecoder {
  private view: DataView;
  constructor(
    private buf: Uint8Array,
    private pos: number,
  ) {
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  private bytes(n: number): Uint8Array {
    const out = this.buf.slice(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  private uint(size: number): number {
    const v = this.view;
    const p = this.pos;
    this.pos += size;
    return size === 1 ? v.getUint8(p) : size === 2 ? v.getUint16(p) : v.getUint32(p);
  }

  private str(n: number): string {
    const s = utf8.decode(this.buf.subarray(this.pos, this.pos + n));
    this.pos += n;
    return s;
  }

  read(): unknown {
    const b = this.buf[this.pos++];
    const v = this.view;
    if (b <= 0x7f) return b;
    if (b >= 0xe0) return b - 0x100;
    if (b <= 0x8f) return this.map(b & 0x0f);
    if (b <= 0x9f) return this.array(b & 0x0f);
    if (b <= 0xbf) return this.str(b & 0x1f);
    const p = this.pos;
    switch (b) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xc4:
        return this.bytes(this.uint(1));
      case 0xc5:
        return this.bytes(this.uint(2));
      case 0xc6:
        return this.bytes(this.uint(4));
      case 0xc7:
      case 0xc8:
      case 0xc9: {
        const n = this.uint(b === 0xc7 ? 1 : b === 0xc8 ? 2 : 4);
        const type = v.getInt8(this.pos++);
        return new Ext(type, this.bytes(n));
      }
      case 0xca:
        this.pos += 4;
        return v.getFloat32(p);
      case 0xcb:
        this.pos += 8;
        return v.getFloat64(p);
      case 0xcc:
        return this.uint(1);
      case 0xcd:
        return this.uint(2);
      case 0xce:
        return this.uint(4);
      case 0xcf:
        this.pos += 8;
        return normalize(v.getBigUint64(p));
      case 0xd0:
        this.pos += 1;
        return v.getInt8(p);
      case 0xd1:
        this.pos += 2;
        return v.getInt16(p);
      case 0xd2:
        this.pos += 4;
        return v.getInt32(p);
      case 0xd3:
        this.pos += 8;
        return normalize(v.getBigInt64(p));
      case 0xd4:
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8: {
        const type = v.getInt8(this.pos++);
        return new Ext(type, this.bytes(1 << (b - 0xd4)));
      }
      case 0xd9:
        return this.str(this.uint(1));
      case 0xda:
        return this.str(this.uint(2));
      case 0xdb:
        return this.str(this.uint(4));
      case 0xdc:
        return this.array(this.uint(2));
      case 0xdd:
        return this.array(this.uint(4));
      case 0xde:
        return this.map(this.uint(2));
      default: // 0xdf; the scanner refused everything else
        return this.map(this.uint(4));
    }
  }

  private array(n: number): unknown[] {
    const out = new Array<unknown>(n);
    for (let i = 0; i < n; i++) out[i] = this.read();
    return out;
  }

  private map(n: number): unknown {
    const keys: unknown[] = [];
    const values: unknown[] = [];
    let binary = false;
    for (let i = 0; i < n; i++) {
      const key = this.read();
      if (typeof key !== "string") binary = true;
      keys.push(key);
      values.push(this.read());
    }
    if (binary) return new Map(keys.map((k, i) => [k, values[i]]));
    const out: Record<string, unknown> = {};
    for (let i = 0; i < n; i++) {
      Object.defineProperty(out, keys[i] as string, { value: values[i], enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
}

/** An integer as `number` when it is exact as one, else `bigint`. */
export function normalize(value: bigint): number | bigint {
  return value >= -9007199254740991n && value <= 9007199254740991n ? Number(value) : value;
}

/**
 * msgpack encoder into one growing buffer, shortest encoding of every value (as msgpack's
 * reference encoders and the golden vectors do).
 *
 * - `number`: an integer (when `Number.isInteger` and within 64 bits) or else float64; so
 *   `1.0` is sent as the integer 1 (JS cannot tell them apart): wrap it as `new Float64(1)`.
 * - `bigint`: an integer; outside -2^63 .. 2^64-1 it is refused.
 * - `string`: str; `Uint8Array` (and other ArrayBuffer views): bin; `Ext`: ext.
 * - arrays: array; `Map`: map (keys must be strings or Uint8Array); other objects: map of
 *   their own enumerable string keys (entries whose value is `undefined` are left out).
 * - `null` and `undefined`: nil. Anything else (functions, symbols) is refused.
 */
export class Encoder {
  buf: Uint8Array;
  view: DataView;
  pos = 0;

  constructor(size = 65536) {
    this.buf = new Uint8Array(size);
    this.view = new DataView(this.buf.buffer);
  }

  /** The bytes written since the last `take`, copied out; the buffer is reused. */
  take(): Uint8Array {
    const out = this.buf.slice(0, this.pos);
    this.pos = 0;
    return out;
  }

  /** Truncate to `pos` (to undo a partly written frame). */
  rewind(pos: number): void {
    this.pos = pos;
  }

  private ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  byte(b: number): void {
    this.ensure(1);
    this.buf[this.pos++] = b;
  }

  raw(bytes: Uint8Array): void {
    this.ensure(bytes.length);
    this.buf.set(bytes, this.pos);
    this.pos += bytes.length;
  }

  arrayHeader(n: number): void {
    this.ensure(5);
    if (n < 16) this.buf[this.pos++] = 0x90 | n;
    else if (n < 0x10000) {
      this.buf[this.pos++] = 0xdc;
      this.view.setUint16(this.pos, n);
      this.pos += 2;
    } else {
      this.buf[this.pos++] = 0xdd;
      this.view.setUint32(this.pos, n);
      this.pos += 4;
    }
  }

  mapHeader(n: number): void {
    this.ensure(5);
    if (n < 16) this.buf[this.pos++] = 0x80 | n;
    else if (n < 0x10000) {
      this.buf[this.pos++] = 0xde;
      this.view.setUint16(this.pos, n);
      this.pos += 2;
    } else {
      this.buf[this.pos++] = 0xdf;
      this.view.setUint32(this.pos, n);
      this.pos += 4;
    }
  }

  /** An integer given as a safe-integer number or a bigint. */
  int(value: number | bigint): void {
    if (typeof value === "bigint") return this.bigint(value);
    this.ensure(9);
    const buf = this.buf;
    const view = this.view;
    if (value >= 0) {
      if (value < 0x80) buf[this.pos++] = value;
      else if (value < 0x100) {
        buf[this.pos++] = 0xcc;
        buf[this.pos++] = value;
      } else if (value < 0x10000) {
        buf[this.pos++] = 0xcd;
        view.setUint16(this.pos, value);
        this.pos += 2;
      } else if (value < TWO_32) {
        buf[this.pos++] = 0xce;
        view.setUint32(this.pos, value);
        this.pos += 4;
      } else {
        buf[this.pos++] = 0xcf;
        view.setBigUint64(this.pos, BigInt(value));
        this.pos += 8;
      }
    } else if (value >= -32) buf[this.pos++] = value + 0x100;
    else if (value >= -0x80) {
      buf[this.pos++] = 0xd0;
      view.setInt8(this.pos++, value);
    } else if (value >= -0x8000) {
      buf[this.pos++] = 0xd1;
      view.setInt16(this.pos, value);
      this.pos += 2;
    } else if (value >= -0x80000000) {
      buf[this.pos++] = 0xd2;
      view.setInt32(this.pos, value);
      this.pos += 4;
    } else {
      buf[this.pos++] = 0xd3;
      view.setBigInt64(this.pos, BigInt(value));
      this.pos += 8;
    }
  }

  private bigint(value: bigint): void {
    if (value >= -0x80000000n && value < 0x100000000n) return this.int(Number(value));
    if (value > MAX_UINT64 || value < MIN_INT64) throw new RangeError(`${value} does not fit in 64 bits`);
    this.ensure(9);
    if (value > 0n) {
      this.buf[this.pos++] = 0xcf;
      this.view.setBigUint64(this.pos, value);
    } else {
      this.buf[this.pos++] = 0xd3;
      this.view.setBigInt64(this.pos, value);
    }
    this.pos += 8;
  }

  str(value: string): void {
    // Worst case 3 bytes per UTF-16 unit; encode in place after a header of the right size.
    const max = value.length * 3;
    this.ensure(max + 5);
    let ascii = value.length < 64;
    if (ascii) {
      for (let i = 0; i < value.length; i++) {
        if (value.charCodeAt(i) > 0x7f) {
          ascii = false;
          break;
        }
      }
    }
    if (ascii) {
      const n = value.length;
      this.strHeader(n);
      for (let i = 0; i < n; i++) this.buf[this.pos++] = value.charCodeAt(i);
      return;
    }
    const bytes = utf8Encoder.encode(value);
    this.strHeader(bytes.length);
    this.raw(bytes);
  }

  private strHeader(n: number): void {
    this.ensure(5);
    if (n < 32) this.buf[this.pos++] = 0xa0 | n;
    else if (n < 0x100) {
      this.buf[this.pos++] = 0xd9;
      this.buf[this.pos++] = n;
    } else if (n < 0x10000) {
      this.buf[this.pos++] = 0xda;
      this.view.setUint16(this.pos, n);
      this.pos += 2;
    } else {
      this.buf[this.pos++] = 0xdb;
      this.view.setUint32(this.pos, n);
      this.pos += 4;
    }
  }

  bin(value: Uint8Array): void {
    const n = value.length;
    this.ensure(5);
    if (n < 0x100) {
      this.buf[this.pos++] = 0xc4;
      this.buf[this.pos++] = n;
    } else if (n < 0x10000) {
      this.buf[this.pos++] = 0xc5;
      this.view.setUint16(this.pos, n);
      this.pos += 2;
    } else {
      this.buf[this.pos++] = 0xc6;
      this.view.setUint32(this.pos, n);
      this.pos += 4;
    }
    this.raw(value);
  }

  value(value: unknown, depth = 0): void {
    if (depth > MAX_DEPTH) throw new RangeError(`values nest deeper than ${MAX_DEPTH} levels`);
    switch (typeof value) {
      case "number":
        if (Number.isInteger(value) && value < 18446744073709551616 && value >= -9223372036854775808) {
          if (Number.isSafeInteger(value)) this.int(value);
          else this.bigint(BigInt(value));
        } else {
          this.ensure(9);
          this.buf[this.pos++] = 0xcb;
          this.view.setFloat64(this.pos, value);
          this.pos += 8;
        }
        return;
      case "string":
        return this.str(value);
      case "boolean":
        return this.byte(value ? 0xc3 : 0xc2);
      case "bigint":
        return this.bigint(value);
      case "undefined":
        return this.byte(0xc0);
      case "object":
        break;
      default:
        throw new TypeError(`a ${typeof value} is not encodable as msgpack`);
    }
    if (value === null) return this.byte(0xc0);
    if (Array.isArray(value)) {
      this.arrayHeader(value.length);
      for (const element of value) this.value(element, depth + 1);
      return;
    }
    if (value instanceof Uint8Array) return this.bin(value);
    if (ArrayBuffer.isView(value)) return this.bin(new Uint8Array(value.buffer, value.byteOffset, value.byteLength));
    if (value instanceof ArrayBuffer) return this.bin(new Uint8Array(value));
    if (value instanceof Ext) return this.ext(value);
    if (value instanceof Float64) {
      this.ensure(9);
      this.buf[this.pos++] = 0xcb;
      this.view.setFloat64(this.pos, value.value);
      this.pos += 8;
      return;
    }
    if (value instanceof Map) {
      this.mapHeader(value.size);
      for (const [k, v] of value) {
        if (typeof k === "string") this.str(k);
        else if (k instanceof Uint8Array) this.bin(k);
        else throw new TypeError("map keys must be strings or Uint8Array");
        this.value(v, depth + 1);
      }
      return;
    }
    // Only a plain object is a map: a Date, Set, RegExp, Error or class instance has no own
    // enumerable fields (or not the ones that matter), and would arrive as {} without a word.
    const prototype = Object.getPrototypeOf(value);
    if (prototype !== Object.prototype && prototype !== null) {
      const kind = prototype?.constructor?.name || "non-plain object";
      throw new TypeError(
        `a ${kind} is not encodable as msgpack: send a plain object, array, Map, string, number or bytes (e.g. a Date's getTime())`,
      );
    }
    const record = value as Record<string, unknown>;
    const keys = Object.keys(record).filter((k) => record[k] !== undefined);
    this.mapHeader(keys.length);
    for (const k of keys) {
      this.str(k);
      this.value(record[k], depth + 1);
    }
  }

  private ext(value: Ext): void {
    const n = value.data.length;
    this.ensure(6);
    const fixed = [1, 2, 4, 8, 16].indexOf(n);
    if (fixed >= 0) this.buf[this.pos++] = 0xd4 + fixed;
    else if (n < 0x100) {
      this.buf[this.pos++] = 0xc7;
      this.buf[this.pos++] = n;
    } else if (n < 0x10000) {
      this.buf[this.pos++] = 0xc8;
      this.view.setUint16(this.pos, n);
      this.pos += 2;
    } else {
      this.buf[this.pos++] = 0xc9;
      this.view.setUint32(this.pos, n);
      this.pos += 4;
    }
    this.view.setInt8(this.pos++, value.type);
    this.raw(value.data);
  }
}

/** The msgpack encoding of one value (convenience; the connection reuses one Encoder). */
export function encode(value: unknown): Uint8Array {
  const encoder = new Encoder(256);
  encoder.value(value);
  return encoder.take();
}

/** Decode exactly one msgpack value (convenience for tests and tools). */
export function decode(bytes: Uint8Array): unknown {
  const scanner = new Scanner();
  scanner.reset(bytes, bytes.length, Number.MAX_SAFE_INTEGER);
  const end = scanner.scan(0);
  if (end !== bytes.length) throw violation(end < 0 ? "truncated msgpack value" : "bytes after the msgpack value");
  return decodeRange(bytes, 0, end, scanner.flags);
}

export { MAX_INT64 };

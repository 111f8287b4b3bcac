/**
 * Errors as the application sees them (protocol/SPEC.md section 11).
 *
 * `RsnetError` is the root. A remote `onError`, a rejected stream or a detected violation on
 * one stream is a `StreamError` with the protocol code, whatever the code (unknown codes are
 * delivered unchanged). A connection that ends under open streams ends them with
 * `ConnectionLost`; a refused or failed handshake is a `HandshakeError` (a `ConnectionLost`).
 * `ProtocolError` is what the sans-I/O core raises: for the peer's violations internally, and
 * to the application when a call would break the protocol (it is never sent anything then).
 */

/** Protocol error codes (SPEC 11.2). Codes from 4096 up belong to applications. */
export const ErrorCode = {
  PROTOCOL_ERROR: 1,
  FLOW_CONTROL: 2,
  INVALID_REQUEST: 3,
  FRAME_TOO_LARGE: 4,
  UNSUPPORTED_VERSION: 5,
  UNAUTHORIZED: 6,
  UNKNOWN_PUBLISHER: 7,
  REJECTED: 8,
  TOO_MANY_STREAMS: 9,
  GOING_AWAY: 10,
  TIMEOUT: 11,
  INTERNAL: 12,
  APPLICATION_ERROR: 4096,
} as const;

/** An error code: a safe integer, or a bigint for application codes beyond 2^53. */
export type Code = number | bigint;

const NAMES = new Map<number, string>(Object.entries(ErrorCode).map(([name, code]) => [code, name]));

/**
 * Name application codes (4096 and up) for `codeName` and `StreamError.codeName`, as a library
 * on top of the protocol does for its own (the broker helpers register `BrokerCode`).
 */
export function registerCodeNames(table: Readonly<Record<string, number>>): void {
  for (const [name, code] of Object.entries(table)) {
    if (!(Number.isSafeInteger(code) && code >= 4096)) throw new RangeError(`application codes are 4096 or more: ${name} = ${code}`);
    NAMES.set(code, name);
  }
}

/** The code's name in SPEC 11.2 (or registered), or `application error N` / `unknown code N`. */
export function codeName(code: Code): string {
  const name = typeof code === "number" ? NAMES.get(code) : undefined;
  if (name !== undefined) return name;
  return Number(code) >= 4096 ? `application error ${code}` : `unknown code ${code}`;
}

export class RsnetError extends Error {
  override name = "RsnetError";
}

/** A stream ended with an error code: a remote `onError`, a rejection, or a violation. */
export class StreamError extends RsnetError {
  override name = "StreamError";
  readonly code: Code;
  readonly codeName: string;
  readonly data: unknown;
  /** The peer's message (may be empty); `message` also names the code. */
  readonly detail: string;

  constructor(code: Code, message = "", data: unknown = null) {
    const name = codeName(code);
    super(message ? `${name}: ${message}` : name);
    this.code = code;
    this.codeName = name;
    this.detail = message;
    this.data = data;
  }
}

/** The connection ended (closed, reset, timed out, closed with CONN_ERROR) under open streams.
 *  `code` is the CONN_ERROR code when there was one, else `null`. */
export class ConnectionLost extends RsnetError {
  override name = "ConnectionLost";
  readonly code: Code | null;
  readonly data: unknown;

  constructor(message: string, code: Code | null = null, data: unknown = null) {
    super(message);
    this.code = code;
    this.data = data;
  }
}

/** The handshake failed: refused by the server (`code` says why), timed out, or cut off. */
export class HandshakeError extends ConnectionLost {
  override name = "HandshakeError";
}

/** A protocol rule was (or would have been) broken; `code` is the SPEC 11.2 code to answer with. */
export class ProtocolError extends RsnetError {
  override name = "ProtocolError";
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

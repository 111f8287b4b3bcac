/**
 * Transports: byte streams (Node `net`) and WebSocket (Node `ws`, or the browser's native
 * WebSocket). A transport only moves bytes; the client drives the protocol.
 *
 * Node modules are imported dynamically, only when a Node transport is opened, so the package
 * loads in a browser as plain ES modules.
 */

export interface Transport {
  /** WebSocket: each `send` chunk is one binary message of whole frames (SPEC 2.2). */
  readonly messageBased: boolean;
  /** Write chunks in order (messages on a WebSocket, bytes on a byte stream). */
  send(chunks: Uint8Array[]): void;
  /** Bytes queued by `send` and not yet handed to the network. */
  readonly buffered: number;
  /** Resolves once `buffered` is below `low` (or the transport closed). */
  drained(low: number): Promise<void>;
  /** Close our side gracefully (TCP FIN / WebSocket close 1000). */
  end(): void;
  /** Close at once. */
  destroy(): void;
  /** Set by the owner: received bytes / a received message. */
  onData: (data: Uint8Array) => void;
  /** Set by the owner: the transport closed; `error` when it failed. Called once. */
  onClose: (error?: Error) => void;
  /** Set by the owner: a text message arrived (a PROTOCOL_ERROR, SPEC 2.2). */
  onText: () => void;
}

export class TransportError extends Error {
  override name = "TransportError";
}

const isNode = typeof process !== "undefined" && typeof process.versions?.node === "string";

/**
 * How a Node client checks the server's certificate over tls:// and wss:// (Node's `tls`
 * options of the same names; a browser checks with its own trust store and ignores these).
 * By default, against Node's CA list and `NODE_EXTRA_CA_CERTS`.
 */
export interface TlsOptions {
  /** Certificate authorities to trust in place of Node's list (PEM text). */
  ca?: string | string[];
  /** The name the certificate must be for (default: the URL's host, unless an IP address). */
  servername?: string;
  /** `false` accepts any certificate: for tests only, never in production. Default true. */
  rejectUnauthorized?: boolean;
}

/**
 * The address `url` names, checked: tcp://host:port or tls://host:port (Node only),
 * ws://host:port/path or wss://... Throws `TypeError` for one no transport can use (a mistake
 * to fix, not a failure to retry).
 */
export function parseUrl(url: string): URL {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new TypeError(`expected tcp://host:port, tls://host:port, ws://host:port/path or wss://..., got ${JSON.stringify(url)}`);
  }
  const scheme = parsed.protocol.replace(/:$/, "");
  if (scheme === "tcp" || scheme === "tls") {
    if (!isNode) throw new TypeError(`${scheme}:// needs Node (browsers have WebSocket only): use ws:// or wss://`);
    if (!parsed.hostname || !parsed.port) throw new TypeError(`expected ${scheme}://host:port, got ${JSON.stringify(url)}`);
  } else if (scheme !== "ws" && scheme !== "wss") {
    throw new TypeError(`expected tcp://, tls://, ws:// or wss://, got ${JSON.stringify(url)}`);
  }
  return parsed;
}

/** Open a transport to `url`, as `parseUrl` checked it (`tls`: for tls:// and wss:// in Node). */
export async function openTransport(url: URL, maxMessageSize: number, signal?: AbortSignal, tls: TlsOptions = {}): Promise<Transport> {
  if (url.protocol === "tcp:" || url.protocol === "tls:") {
    const host = url.hostname.replace(/^\[|\]$/g, "");
    return openTcp(host, Number(url.port), signal, url.protocol === "tls:" ? tls : undefined);
  }
  return isNode ? openNodeWebSocket(url.href, maxMessageSize, signal, tls) : openBrowserWebSocket(url.href, signal);
}

/**
 * Wait for a transport being opened, closing it at once if `signal` aborts first (connect's
 * deadline passed): the socket must not outlive the failed connect, and a browser lets only
 * one WebSocket per host be connecting at a time, so one left connecting would hold up every
 * later connection to that host.
 */
function opening(signal: AbortSignal | undefined, abandon: () => void, wait: (settle: { resolve: () => void; reject: (error: Error) => void }) => void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const abort = () => {
      abandon();
      reject(new TransportError("abandoned while opening"));
    };
    if (signal?.aborted) return abort();
    signal?.addEventListener("abort", abort, { once: true });
    wait({
      resolve: () => {
        signal?.removeEventListener("abort", abort);
        resolve();
      },
      reject: (error) => {
        signal?.removeEventListener("abort", abort);
        reject(error);
      },
    });
  });
}

abstract class Base implements Transport {
  abstract readonly messageBased: boolean;
  onData: (data: Uint8Array) => void = () => {};
  onClose: (error?: Error) => void = () => {};
  onText: () => void = () => {};
  protected closed = false;
  private waiters: (() => void)[] = [];

  abstract send(chunks: Uint8Array[]): void;
  abstract get buffered(): number;
  abstract end(): void;
  abstract destroy(): void;

  drained(low: number): Promise<void> {
    if (this.closed || this.buffered < low) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  protected wakeDrained(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  protected closedWith(error?: Error): void {
    if (this.closed) return;
    this.closed = true;
    this.wakeDrained();
    this.onClose(error);
  }
}

/**
 * A Node Buffer as a plain Uint8Array over the same memory. Decoded binary values are copied
 * out of the received bytes; from a Buffer, each copy goes through Buffer's JavaScript
 * constructor (its species), from a Uint8Array it is one native slice: about 2x less client
 * CPU per 16-byte item. And binary values are then Uint8Array in Node as in browsers.
 */
function plain(data: Buffer): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

/** The most a TCP read takes at once (libuv's own read size). */
const READ_SIZE = 65536;

/** A TCP connection, or TLS over one when `tls` is given (tls://). */
async function openTcp(host: string, port: number, signal?: AbortSignal, tls?: TlsOptions): Promise<Transport> {
  const net = await import("node:net");
  let socket: import("node:net").Socket;
  let received: (data: Uint8Array) => void = () => {};
  if (tls === undefined) {
    // Reads go into one buffer of ours, handed to `received` straight from the read (`onread`),
    // instead of a fresh 64 KiB Buffer per read pushed through the socket's Readable stream and
    // its "data" event: the client copies out all it keeps (see receiveData), so the buffer can
    // be reused at once. Measured on scenario 6's TCP rows (1,000,000 16-byte items): see README.
    const buffer = new Uint8Array(READ_SIZE);
    const callback = (n: number): boolean => {
      received(buffer.subarray(0, n));
      return true; // keep reading
    };
    socket = net.connect({ host, port, noDelay: true, onread: { buffer, callback } });
  } else {
    const { connect } = await import("node:tls");
    // SNI takes a name, not an address: an IP address is checked against the certificate as one.
    const servername = tls.servername ?? (net.isIP(host) ? undefined : host);
    socket = connect({ host, port, ...tls, servername });
    socket.setNoDelay(true);
  }
  const scheme = tls === undefined ? "tcp" : "tls";
  await opening(signal, () => socket.destroy(), ({ resolve, reject }) => {
    socket.once(tls === undefined ? "connect" : "secureConnect", resolve);
    socket.once("error", (error) => reject(new TransportError(`cannot connect to ${scheme}://${host}:${port}: ${error.message}`)));
  });
  class Tcp extends Base {
    readonly messageBased = false;
    private failure: Error | undefined;
    constructor() {
      super();
      if (tls === undefined) received = (data) => this.onData(data);
      else socket.on("data", (data: Buffer) => this.onData(plain(data)));
      socket.on("drain", () => this.wakeDrained());
      socket.on("error", (error) => (this.failure = new TransportError(error.message)));
      socket.on("close", () => this.closedWith(this.failure));
    }
    get buffered(): number {
      return socket.writableLength;
    }
    send(chunks: Uint8Array[]): void {
      if (this.closed || socket.writableEnded) return;
      for (const chunk of chunks) socket.write(chunk);
    }
    end(): void {
      if (!socket.writableEnded) socket.end();
    }
    destroy(): void {
      socket.destroy();
    }
  }
  return new Tcp();
}

/**
 * The `ws` package, loaded with `require`: `ws` is CommonJS, and an `import` of it from ES
 * modules makes Node run its CommonJS export scanner over the eight files of ws's ESM wrapper,
 * measured at about 3x the CPU of `require` here (60-100 ms against 20-25 ms), plus a
 * background compile of that scanner that kept a core busy for about 150 ms more while the
 * first stream ran.
 */
async function loadWs(): Promise<typeof import("ws")> {
  const { createRequire } = await import("node:module");
  return createRequire(import.meta.url)("ws") as typeof import("ws");
}

/** What a server that answered the WebSocket request with no HTTP response said instead: an
 *  rsnet frame (its CONN_ERROR) from an rsnet TCP port, most likely. Node's HTTP parser keeps
 *  the bytes it refused (`rawPacket`); its own message names only what it expected. */
function notHttp(error: Error & { code?: string; rawPacket?: Uint8Array }): string | undefined {
  if (error.code !== "HPE_INVALID_CONSTANT") return undefined;
  const first = error.rawPacket?.[0];
  if (first !== undefined && first >= 0x90 && first <= 0x9f) {
    return "the server answered in the rsnet protocol, not HTTP: connect with tcp://";
  }
  return `the server did not answer in HTTP (${error.message})`;
}

/** How the HTTP response to a WebSocket request must begin for `WsReader` to read the frames
 *  after it (any other, a 1xx before the 101 included, and `ws` reads everything). */
const SWITCHING = Array.from("HTTP/1.1 101 ", (c) => c.charCodeAt(0));
/** CR LF CR LF: the end of the response's header block (a 101 has no body). */
const HEADER_END = [13, 10, 13, 10];
/** The longest frame header: 2 bytes, a 64-bit length, a mask key. */
const MAX_HEADER = 14;

/**
 * Reads a ws:// connection's socket in `ws`'s place, into one reused buffer (`onread`, as a TCP
 * connection does), and hands the payload of each binary message to `onPayload` straight from
 * the read, in pieces as it arrives: the client decodes a connection's messages as one byte
 * stream (SPEC 2.2) and copies out all it keeps (see receiveData). Through `ws`, each read was a
 * fresh 64 KiB Buffer pushed through the socket's stream, its "data" event and `ws`'s parser (a
 * Writable, which paused and resumed the socket after every read of 16 KiB or more): 0.132 µs
 * of Node CPU per 16-byte item against 0.089 over TCP; read here, 0.099 (scenario 6; README).
 *
 * Every other byte goes to `ws` as the socket would have given it (`socket.push`, in order): the
 * HTTP response, which Node's HTTP client parses, and all of each frame not taken here: pings,
 * close, text, fragments, a masked or oversized frame, anything before the transport is open or
 * once `ws` no longer is (a close begun, an error), or while `ws` has bytes still to take. So
 * `ws` keeps answering, checking and failing as before; this only takes the frames `ws` would
 * have emitted at once as one binary "message" (FIN, opcode 2, no RSV bits, no mask, within
 * `maxPayload`, no fragmented message under way).
 */
class WsReader {
  readonly buffer = new Uint8Array(READ_SIZE);
  /** Set once the transport is open: a piece of a binary message's payload. */
  onPayload: ((data: Uint8Array) => void) | null = null;
  /** The socket `ws` reads through (our pushes are its "data"), once created. */
  socket: import("node:net").Socket | null = null;
  /** "status" (matching SWITCHING), "header" (looking for HEADER_END), "frames", or "ws" (all to `ws`). */
  private phase: "status" | "header" | "frames" | "ws" = "status";
  /** Bytes of SWITCHING or HEADER_END matched so far. */
  private matched = 0;
  /** A frame header split between reads: its first `headLength` bytes. */
  private readonly head = new Uint8Array(MAX_HEADER);
  private headLength = 0;
  /** Payload bytes of the current frame still to come, and whether they go to `onPayload`. */
  private left = 0;
  private taking = false;
  /** A text or binary message `ws` is assembling from fragments (its continuations go to `ws`). */
  private fragmented = false;

  constructor(
    private readonly net: typeof import("node:net"),
    private readonly maxPayload: number,
    private readonly isOpen: () => boolean,
  ) {}

  /** `ws`'s `createConnection`: the socket as `ws` would open it (`path`, the request's, is no
   *  IPC path here), reading into `buffer`. */
  readonly connect = ((options: import("node:net").NetConnectOpts) => {
    const onread = { buffer: this.buffer, callback: this.read };
    return (this.socket = this.net.connect({ ...options, path: undefined, onread } as import("node:net").NetConnectOpts));
  }) as typeof import("node:net").createConnection;

  /** The `onread` callback: `n` bytes arrived in `buffer`. */
  readonly read = (n: number): boolean => {
    const buf = this.buffer;
    let p = this.phase === "frames" ? 0 : this.response(n);
    while (p < n) {
      if (this.left > 0) {
        const end = Math.min(n, p + this.left);
        this.left -= end - p;
        if (this.taking) this.onPayload!(buf.subarray(p, end));
        else this.toWs(buf.subarray(p, end));
        p = end;
      } else p = this.frameHeader(p, n);
    }
    return true; // keep reading (`ws` pauses the socket itself if it must)
  };

  /** Hands the HTTP response's bytes to `ws`; returns where frames begin (`n`: not in these bytes). */
  private response(n: number): number {
    const buf = this.buffer;
    let p = 0;
    while (p < n && this.phase === "status") {
      if (buf[p++] !== SWITCHING[this.matched++]) this.phase = "ws";
      else if (this.matched === SWITCHING.length) [this.phase, this.matched] = ["header", 0];
    }
    while (p < n && this.phase === "header") {
      const byte = buf[p++];
      this.matched = byte === HEADER_END[this.matched] ? this.matched + 1 : byte === 13 ? 1 : 0;
      if (this.matched === HEADER_END.length) this.phase = "frames";
    }
    if (this.phase === "ws") p = n;
    this.toWs(buf.subarray(0, p));
    return p;
  }

  /** Reads the frame header at `p` (or keeps its start for the next read); returns where it ends. */
  private frameHeader(p: number, n: number): number {
    let h: Uint8Array = this.buffer;
    let at = p;
    let available = n - p;
    const kept = this.headLength;
    if (kept > 0) {
      // The rest of a header split between reads: joined in `head`.
      const more = Math.min(MAX_HEADER - kept, n - p);
      this.head.set(this.buffer.subarray(p, p + more), kept);
      [h, at, available] = [this.head, 0, kept + more];
    }
    const b0 = h[at];
    const b1 = h[at + 1];
    const size = available < 2 ? 0 : 2 + ((b1 & 0x7f) === 126 ? 2 : (b1 & 0x7f) === 127 ? 8 : 0) + (b1 & 0x80 ? 4 : 0);
    if (size === 0 || available < size) {
      if (kept === 0) this.head.set(this.buffer.subarray(p, n));
      this.headLength = available;
      return n;
    }
    this.headLength = 0;
    let length = b1 & 0x7f;
    if (length === 126) length = (h[at + 2] << 8) | h[at + 3];
    else if (length === 127) length = (h[at + 2] * 0x1000000 + ((h[at + 3] << 16) | (h[at + 4] << 8) | h[at + 5])) * 0x100000000 + (h[at + 6] * 0x1000000 + ((h[at + 7] << 16) | (h[at + 8] << 8) | h[at + 9]));
    this.taking =
      b0 === 0x82 && // FIN, no RSV bits, binary: a whole message in one frame
      (b1 & 0x80) === 0 && // not masked (a server's frames never are)
      length <= this.maxPayload &&
      !this.fragmented && // (`ws` wants a continuation there)
      this.onPayload !== null &&
      this.isOpen() &&
      this.socket!.readableLength === 0; // `ws` has taken every byte given to it: the order holds
    if (!this.taking) {
      this.toWs(h.subarray(at, at + size));
      const opcode = b0 & 0x0f;
      if (opcode === 1 || opcode === 2) this.fragmented = (b0 & 0x80) === 0;
      else if (opcode === 0 && b0 & 0x80) this.fragmented = false;
    }
    this.left = length;
    return p + size - kept;
  }

  /** Gives `ws` bytes as the socket would have (a copy: `buffer` is read into again). */
  private toWs(bytes: Uint8Array): void {
    if (bytes.length > 0) this.socket!.push(Buffer.from(bytes));
  }
}

async function openNodeWebSocket(url: string, maxMessageSize: number, signal?: AbortSignal, tls: TlsOptions = {}): Promise<Transport> {
  const { WebSocket } = await loadWs();
  // ws:// only: `onread` is a net.Socket option (wss:// reads through `ws` as before).
  const reader = url.startsWith("ws:") ? new WsReader(await import("node:net"), maxMessageSize, (): boolean => ws.readyState === WebSocket.OPEN) : null;
  const ws = new WebSocket(url, ["rsnet"], { ...tls, maxPayload: maxMessageSize, perMessageDeflate: false, createConnection: reader?.connect });
  ws.on("error", () => {}); // a terminate() while connecting also emits one: the open's handler has settled
  await opening(signal, () => ws.terminate(), ({ resolve, reject }) => {
    ws.once("open", resolve);
    ws.once("error", (error) => reject(new TransportError(`cannot connect to ${url}: ${notHttp(error) ?? error.message}`)));
  });
  class NodeWs extends Base {
    readonly messageBased = true;
    private failure: Error | undefined;
    constructor() {
      super();
      if (reader !== null) reader.onPayload = (data) => this.onData(data);
      // Binary messages `reader` left to `ws` (and all of them over wss://) arrive here.
      ws.on("message", (data: Buffer, isBinary: boolean) => (isBinary ? this.onData(plain(data)) : this.onText()));
      ws.on("error", (error) => (this.failure = new TransportError(error.message)));
      ws.on("close", () => this.closedWith(this.failure));
    }
    get buffered(): number {
      return ws.bufferedAmount;
    }
    send(chunks: Uint8Array[]): void {
      if (this.closed || ws.readyState !== WebSocket.OPEN) return;
      for (const chunk of chunks) ws.send(chunk, { binary: true }, () => this.wakeDrained());
    }
    end(): void {
      if (ws.readyState === WebSocket.OPEN) ws.close(1000);
    }
    destroy(): void {
      ws.terminate();
    }
  }
  return new NodeWs();
}

async function openBrowserWebSocket(url: string, signal?: AbortSignal): Promise<Transport> {
  const ws = new WebSocket(url, ["rsnet"]);
  ws.binaryType = "arraybuffer";
  await opening(signal, () => ws.close(), ({ resolve, reject }) => {
    ws.onopen = () => resolve();
    ws.onerror = () => reject(new TransportError(`cannot connect to ${url}`));
  });
  class BrowserWs extends Base {
    readonly messageBased = true;
    private poll: ReturnType<typeof setInterval> | undefined;
    constructor() {
      super();
      ws.onmessage = (message) => {
        if (typeof message.data === "string") this.onText();
        else this.onData(new Uint8Array(message.data as ArrayBuffer));
      };
      ws.onerror = () => {};
      ws.onclose = (event) => {
        if (this.poll !== undefined) clearInterval(this.poll);
        this.closedWith(event.wasClean ? undefined : new TransportError(`WebSocket closed (${event.code})`));
      };
    }
    get buffered(): number {
      return ws.bufferedAmount;
    }
    override drained(low: number): Promise<void> {
      // Browsers have no drain event: poll bufferedAmount while someone waits.
      if (this.poll === undefined && !this.closed && this.buffered >= low) {
        this.poll = setInterval(() => {
          if (this.buffered < low) {
            clearInterval(this.poll);
            this.poll = undefined;
            this.wakeDrained();
          }
        }, 5);
      }
      return super.drained(low);
    }
    send(chunks: Uint8Array[]): void {
      if (this.closed || ws.readyState !== WebSocket.OPEN) return;
      for (const chunk of chunks) ws.send(chunk as Uint8Array<ArrayBuffer>);
    }
    end(): void {
      if (ws.readyState === WebSocket.OPEN) ws.close(1000);
    }
    destroy(): void {
      ws.close();
    }
  }
  return new BrowserWs();
}

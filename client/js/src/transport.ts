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

async function openNodeWebSocket(url: string, maxMessageSize: number, signal?: AbortSignal, tls: TlsOptions = {}): Promise<Transport> {
  const { WebSocket } = await loadWs();
  const ws = new WebSocket(url, ["rsnet"], { ...tls, maxPayload: maxMessageSize, perMessageDeflate: false });
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

export * from "./errors.js";
export { Encoder, Ext, Float64, Scanner, encode, decode } from "./codec.js";
export * from "./frames.js";
export { Connection, type ConnectionOptions, type Event, type Role, type State } from "./connection.js";

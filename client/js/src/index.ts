export * from "./errors.js";
export { Encoder, Ext, Float64, Scanner, encode, decode } from "./codec.js";
export * from "./frames.js";
export { Connection, type ConnectionOptions, type Event, type Role, type State } from "./connection.js";
export {
  Client,
  ItemStream,
  RemotePublisher,
  connect,
  MAX_DEMAND,
  type ConnectOptions,
  type OfferOptions,
  type Publisher,
  type Subscriber,
  type Subscription,
  type SubscribeOptions,
} from "./client.js";
export {
  AdaptiveDemand,
  DEFAULT_BUDGET,
  HEADROOM,
  INITIAL_WINDOW,
  MAX_WINDOW,
  MIN_WINDOW,
  Refill,
  demandPolicy,
  type AdaptiveOptions,
  type Clock,
  type Demand,
  type DemandOptions,
} from "./demand.js";
export { TransportError, type TlsOptions, type Transport } from "./transport.js";
export { BrokerCode, commit, follow, publish, topics, type BrokerRecord, type FollowOptions, type From, type PublishOptions } from "./broker.js";

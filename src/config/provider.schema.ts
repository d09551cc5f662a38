import { z } from 'zod';
import { int } from './schema-parts';

export const tokenSettingsSchema = z
  .object({
    /** Start refreshing this long before expiry. @default 300 */
    refreshAheadSeconds: int(1, 86_400).default(300),
    /** Lifetime assumed when the provider sends no `expires_in`. @default 1800 */
    defaultLifetimeSeconds: int(1, 86_400).default(1800),
    /** Longest a caller waits in the mandatory window before a 503. @default 5000 */
    waitTimeoutMs: int(100, 120_000).default(5000),
    /** Redlock lease; auto-extended while the holder is alive, so it only bounds a dead holder. @default 10000 */
    lockTtlMs: int(200, 300_000).default(10_000),
    /** First retry delay after a failed refresh (full jitter). @default 500 */
    backoffBaseMs: int(10, 60_000).default(500),
    /** Largest retry delay; shrinks further as expiry approaches. @default 30000 */
    backoffMaxMs: int(100, 600_000).default(30_000),
    /**
     * Fleet-wide floor between two tokens obtained from the provider (Redis-enforced; per
     * replica while Redis is down). Bounds the provider's request rate whatever the token
     * lifetime or the callers' `min_ttl`; a corrupt token lifts it, a rejected one never does.
     * @default 5000
     */
    minRefreshIntervalMs: int(100, 600_000).default(5000),
    /**
     * Fleet-wide floor between two invalidations of a client's token after the provider
     * rejected it on a forwarded call (Redis-enforced; per replica while Redis is down). Within
     * it a rejection costs nothing: the 401 is relayed as it is and the token kept. @default 30000
     */
    minRejectionIntervalMs: int(0, 3_600_000).default(30_000),
    /**
     * Invalidations one caller's forwarded calls may cause per client and
     * `rejectionWindowSeconds`; past it its 401s are relayed as they are, counted
     * (`token_broker_token_rejections_total`) and logged, and nothing is invalidated. `0`: no
     * bound. @default 3
     */
    rejectionsPerCaller: int(0, 1_000_000).default(3),
    /** The window of `rejectionsPerCaller`. @default 3600 */
    rejectionWindowSeconds: int(1, 86_400).default(3600),
    /**
     * Most token requests the whole fleet has in flight to one token endpoint at once, all
     * clients of that authorization server together (Redis-enforced; per replica while Redis is
     * down); past it a refresh waits its turn, a fraction of a second. `0`: no bound. @default 8
     */
    endpointMaxConcurrency: int(0, 10_000).default(8),
    /**
     * Most token requests the whole fleet sends one token endpoint per second, all its clients
     * together, so a thousand clients, a restart or a fleet-wide revoke never send more than the
     * provider allows. `0`: no bound. @default 20
     */
    endpointRatePerSecond: int(0, 100_000).default(20),
    /** Re-read credentials this often even without a failure (rotation). @default 3600 */
    credentialsReloadSeconds: int(10, 604_800).default(3600),
  })
  .strict();

export const providerSettingsSchema = z
  .object({
    /** TCP connect timeout to the provider. @default 2000 */
    connectTimeoutMs: int(50, 60_000).default(2000),
    /**
     * Time to the response headers and between body chunks; the whole call, connect included,
     * ends at `connectTimeoutMs + responseTimeoutMs` however the body trickles. @default 5000
     */
    responseTimeoutMs: int(50, 120_000).default(5000),
    /** Token responses larger than this are rejected as malformed. @default 65536 */
    maxTokenResponseBytes: int(1024, 10_485_760).default(65_536),
  })
  .strict();

/** `POST /orders`: limits, timeouts and how long idempotency outcomes are kept. */
export const ordersSettingsSchema = z
  .object({
    /** How long the outcome of an order sent with an `Idempotency-Key` is kept for replays and conflicts. @default 86400 (24 h) */
    idempotencyTtlSeconds: int(60, 30 * 86_400).default(86_400),
    /** Largest order body accepted; a larger one is refused with 413 before it is read. @default 1048576 (1 MiB) */
    bodyLimitBytes: int(1024, 16_777_216).default(1_048_576),
    /** TCP/TLS connect timeout to the checkout API. A connect failure never reached the provider: 502, safe to retry. @default 2000 */
    connectTimeoutMs: int(50, 60_000).default(2000),
    /** Time from sending the order to the provider's response headers; past it the outcome is unknown (504). @default 10000 */
    headersTimeoutMs: int(100, 300_000).default(10_000),
    /**
     * Longest pause between two chunks of the provider's response body. The whole call ends at
     * connect + headers + body timeouts however the body trickles (504, outcome unknown). @default 10000
     */
    bodyTimeoutMs: int(100, 300_000).default(10_000),
    /** Provider responses larger than this are not relayed (502, outcome unknown). @default 1048576 (1 MiB) */
    maxResponseBytes: int(1024, 16_777_216).default(1_048_576),
    /**
     * Request body bytes this replica holds at once, `POST /orders` and the passthrough
     * together. A request whose `Content-Length` does not fit in what is left is refused with 503
     * (`order_body_budget_exhausted`, `forward_body_budget_exhausted`) and `Retry-After` before
     * its body is read; a chunked body is cut off when it outgrows it. `0`: a quarter of the
     * container's memory limit (cgroup), or 64 MiB where there is none. @default 0
     */
    bodyBudgetBytes: int(0, 4_294_967_296).default(0),
    /**
     * The share of {@link bodyBudgetBytes} one caller may hold, in percent: past it that caller
     * is refused with 429 (`*_caller_budget_exceeded`) while others still get through. @default 50
     */
    bodyBudgetCallerPercent: int(1, 100).default(50),
    /**
     * Orders one caller may have in progress on this replica at once, its body being read
     * included; past it 429 `order_caller_budget_exceeded` with `Retry-After`. `0`: no bound.
     * @default 64
     */
    maxInFlightPerCaller: int(0, 100_000).default(64),
    /** Orders per second per client, all callers together, fleet-wide (per replica without Redis); `0`: no limit. @default 100 */
    clientRatePerSecond: int(0, 100_000).default(100),
    /** Extra orders per client allowed above its rate within any 10-second window. @default 200 */
    clientRateBurst: int(0, 1_000_000).default(200),
    /** Orders per second per (client, caller), fleet-wide; `0`: no limit. @default 50 */
    callerRatePerSecond: int(0, 100_000).default(50),
    /** Extra orders per (client, caller) allowed above its rate within any 10-second window. @default 100 */
    callerRateBurst: int(0, 1_000_000).default(100),
    /**
     * Most order `Idempotency-Key` records one caller may hold per client at once (kept
     * `idempotencyTtlSeconds`); past it a keyed order is refused (429
     * `idempotency_records_exceeded`, nothing sent) until its oldest record expires. `0`: no
     * bound. @default 100000
     */
    maxIdempotencyRecordsPerCaller: int(0, 10_000_000).default(100_000),
    /**
     * Most bytes of order `Idempotency-Key` records one caller may hold per client at once in
     * the store (Redis): each record counts its stored answer plus 512 bytes. Past it a keyed
     * order is refused (429 `idempotency_bytes_exceeded`, nothing sent) until records expire;
     * orders in flight when it is reached may pass it by their answers. `0`: no bound.
     * @default 67108864 (64 MiB)
     */
    maxIdempotencyBytesPerCaller: int(0, 68_719_476_736).default(67_108_864),
  })
  .strict();

/** `/provider/<client>/...`: limits of the passthrough. Timeouts and the pool are the orders ones. */
export const forwardSettingsSchema = z
  .object({
    /**
     * Largest request body forwarded; a larger one is refused with 413. Request bodies are
     * held until the call ends (a 401 is retried with the same bytes). @default 1048576 (1 MiB)
     */
    bodyLimitBytes: int(1024, 16_777_216).default(1_048_576),
    /** Largest provider answer relayed; it streams, and is cut off past this. @default 67108864 (64 MiB) */
    maxResponseBytes: int(1024, 4_294_967_296).default(67_108_864),
    /**
     * Largest answer to a request with an `Idempotency-Key`: such an answer is collected whole
     * to be stored for replays; a larger one is 502 and its outcome unknown. @default 1048576 (1 MiB)
     */
    maxStoredResponseBytes: int(1024, 16_777_216).default(1_048_576),
    /**
     * How long the outcome of a passthrough request sent with an `Idempotency-Key` is kept for
     * replays and conflicts: shorter than an order's, since any allowed call may store one.
     * @default 3600 (1 h)
     */
    idempotencyTtlSeconds: int(60, 30 * 86_400).default(3600),
    /**
     * Most passthrough `Idempotency-Key` records one caller may hold per client at once; past
     * it a keyed request is refused (429 `idempotency_records_exceeded`, nothing sent) until its
     * oldest record expires. `0`: no bound. @default 10000
     */
    maxIdempotencyRecordsPerCaller: int(0, 10_000_000).default(10_000),
    /**
     * Most bytes of passthrough `Idempotency-Key` records one caller may hold per client at once
     * in the store (Redis): each record counts its stored answer plus 512 bytes. Past it a keyed
     * request is refused (429 `idempotency_bytes_exceeded`, nothing sent) until records expire;
     * requests in flight when it is reached may pass it by their answers (at most
     * `maxStoredResponseBytes` each). `0`: no bound. @default 16777216 (16 MiB)
     */
    maxIdempotencyBytesPerCaller: int(0, 68_719_476_736).default(16_777_216),
    /**
     * Passthrough requests one caller may have in progress on this replica at once, from the
     * body being read to the answer's last byte; past it 429 `forward_caller_budget_exceeded`
     * with `Retry-After`. `0`: no bound. @default 64
     */
    maxInFlightPerCaller: int(0, 100_000).default(64),
    /** Requests per second per client, all callers together, fleet-wide (per replica without Redis); `0`: no limit. @default 100 */
    clientRatePerSecond: int(0, 100_000).default(100),
    /** Extra requests per client allowed above its rate within any 10-second window. @default 200 */
    clientRateBurst: int(0, 1_000_000).default(200),
    /** Requests per second per (client, caller), fleet-wide; `0`: no limit. @default 50 */
    callerRatePerSecond: int(0, 100_000).default(50),
    /** Extra requests per (client, caller) allowed above its rate within any 10-second window. @default 100 */
    callerRateBurst: int(0, 1_000_000).default(100),
  })
  .strict();
export type ForwardSettings = z.infer<typeof forwardSettingsSchema>;

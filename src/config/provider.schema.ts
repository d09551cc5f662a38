import { z } from 'zod';
import { int } from './schema-parts';

export const tokenSettingsSchema = z
  .object({
    refreshAheadSeconds: int(1, 86_400).default(300).meta({
      description: 'Start refreshing this long before expiry.',
      env: 'TOKEN_REFRESH_AHEAD_SECONDS',
    }),
    defaultLifetimeSeconds: int(1, 86_400).default(1800).meta({
      description: 'Lifetime assumed when the provider sends no `expires_in`.',
      env: 'TOKEN_DEFAULT_LIFETIME_SECONDS',
    }),
    waitTimeoutMs: int(100, 120_000).default(5000).meta({
      description: 'Longest a caller waits in the mandatory window before a 503.',
      env: 'TOKEN_WAIT_TIMEOUT_MS',
    }),
    lockTtlMs: int(200, 300_000)
      .default(10_000)
      .meta({
        description:
          'Redlock lease; auto-extended while the holder ' +
          'is alive, so it only bounds a dead holder.',
        env: 'TOKEN_LOCK_TTL_MS',
      }),
    backoffBaseMs: int(10, 60_000).default(500).meta({
      description: 'First retry delay after a failed refresh (full jitter).',
      env: 'TOKEN_BACKOFF_BASE_MS',
    }),
    backoffMaxMs: int(100, 600_000).default(30_000).meta({
      description: 'Largest retry delay; shrinks further as expiry approaches.',
      env: 'TOKEN_BACKOFF_MAX_MS',
    }),
    minRefreshIntervalMs: int(100, 600_000)
      .default(5000)
      .meta({
        description:
          'Fleet-wide floor between two tokens obtained from the provider ' +
          '(Redis-enforced; per replica while Redis is down). Bounds the ' +
          "provider's request rate whatever the token lifetime or the callers' " +
          '`min_ttl`; a corrupt token lifts it, a rejected one never does.',
        env: 'TOKEN_MIN_REFRESH_INTERVAL_MS',
      }),
    minRejectionIntervalMs: int(0, 3_600_000)
      .default(30_000)
      .meta({
        description:
          "Fleet-wide floor between two invalidations of a client's token after the provider " +
          'rejected it on a forwarded call (Redis-enforced; per replica while Redis is down). ' +
          'Within it a rejection costs nothing: the 401 is relayed as it is and the token kept.',
        env: 'TOKEN_MIN_REJECTION_INTERVAL_MS',
      }),
    rejectionsPerCaller: int(0, 1_000_000)
      .default(3)
      .meta({
        description:
          "Invalidations one caller's forwarded calls may cause per client and " +
          '`rejectionWindowSeconds`; past it its 401s are relayed as they are, counted ' +
          '(`token_broker_token_rejections_total`) and logged, and nothing is invalidated. `0`: ' +
          'no bound.',
        env: 'TOKEN_REJECTIONS_PER_CALLER',
      }),
    rejectionWindowSeconds: int(1, 86_400).default(3600).meta({
      description: 'The window of `rejectionsPerCaller`.',
      env: 'TOKEN_REJECTION_WINDOW_SECONDS',
    }),
    endpointMaxConcurrency: int(0, 10_000)
      .default(8)
      .meta({
        description:
          'Most token requests the whole fleet has in flight to one token endpoint at once, all ' +
          'clients of that authorization server together (Redis-enforced; per replica while ' +
          'Redis is down); past it a refresh waits its turn, a fraction of a second. `0`: no bound.',
        env: 'TOKEN_ENDPOINT_MAX_CONCURRENCY',
      }),
    endpointRatePerSecond: int(0, 100_000)
      .default(20)
      .meta({
        description:
          'Most token requests the whole fleet sends one token endpoint per second, all its ' +
          'clients together, so a thousand clients, a restart or a fleet-wide revoke never send ' +
          'more than the provider allows. `0`: no bound.',
        env: 'TOKEN_ENDPOINT_RATE_PER_SECOND',
      }),
    credentialsReloadSeconds: int(10, 604_800).default(3600).meta({
      description: 'Re-read credentials this often even without a failure (rotation).',
      env: 'CREDENTIALS_RELOAD_SECONDS',
    }),
  })
  .strict();

export const providerSettingsSchema = z
  .object({
    connectTimeoutMs: int(50, 60_000).default(2000).meta({
      description: 'TCP connect timeout to the provider.',
      env: 'PROVIDER_CONNECT_TIMEOUT_MS',
    }),
    responseTimeoutMs: int(50, 120_000)
      .default(5000)
      .meta({
        description:
          'Time to the response headers and between body chunks; the whole call, connect ' +
          'included, ends at `connectTimeoutMs + responseTimeoutMs` however the body trickles.',
        env: 'PROVIDER_RESPONSE_TIMEOUT_MS',
      }),
    maxTokenResponseBytes: int(1024, 10_485_760)
      .default(65_536)
      .meta({ description: 'Token responses larger than this are rejected as malformed.' }),
    metadataRefreshSeconds: int(60, 86_400)
      .default(3600)
      .meta({
        description:
          "How often the metadata of a client's `tokenRequest.issuer` is re-read; a failed " +
          're-read is logged and the last good metadata kept.',
        env: 'PROVIDER_METADATA_REFRESH_SECONDS',
      }),
  })
  .strict();

/** `POST /orders`: limits, timeouts and how long idempotency outcomes are kept. */
export const ordersSettingsSchema = z
  .object({
    idempotencyTtlSeconds: int(60, 30 * 86_400)
      .default(86_400)
      .meta({
        description:
          'How long the outcome of an order sent with an ' +
          '`Idempotency-Key` is kept for replays and conflicts.',
        defaultText: '86400 (24 h)',
        env: 'ORDERS_IDEMPOTENCY_TTL_SECONDS',
      }),
    bodyLimitBytes: int(1024, 16_777_216).default(1_048_576).meta({
      description:
        'Largest order body accepted; a larger one is refused with 413 before it is read.',
      defaultText: '1048576 (1 MiB)',
      env: 'ORDERS_BODY_LIMIT_BYTES',
    }),
    connectTimeoutMs: int(50, 60_000)
      .default(2000)
      .meta({
        description:
          'TCP/TLS connect timeout to the checkout API. A connect ' +
          'failure never reached the provider: 502, safe to retry.',
        env: 'ORDERS_CONNECT_TIMEOUT_MS',
      }),
    headersTimeoutMs: int(100, 300_000)
      .default(10_000)
      .meta({
        description:
          "Time from sending the order to the provider's response " +
          'headers; past it the outcome is unknown (504).',
        env: 'ORDERS_HEADERS_TIMEOUT_MS',
      }),
    bodyTimeoutMs: int(100, 300_000)
      .default(10_000)
      .meta({
        description:
          "Longest pause between two chunks of the provider's response " +
          'body. The whole call ends at connect + headers + body ' +
          'timeouts however the body trickles (504, outcome unknown).',
        env: 'ORDERS_BODY_TIMEOUT_MS',
      }),
    maxResponseBytes: int(1024, 16_777_216).default(1_048_576).meta({
      description: 'Provider responses larger than this are not relayed (502, outcome unknown).',
      defaultText: '1048576 (1 MiB)',
      env: 'ORDERS_MAX_RESPONSE_BYTES',
    }),
    bodyBudgetBytes: int(0, 4_294_967_296)
      .default(0)
      .meta({
        description:
          'Request body bytes this replica holds at once, `POST /orders` and the passthrough ' +
          'together. A request whose `Content-Length` does not fit in what is left is refused ' +
          'with 503 (`order_body_budget_exhausted`, `forward_body_budget_exhausted`) and ' +
          '`Retry-After` before its body is read; a chunked body is cut off when it outgrows it. ' +
          "`0`: a quarter of the container's memory limit (cgroup), or 64 MiB where there is " +
          'none.',
        env: 'ORDERS_BODY_BUDGET_BYTES',
      }),
    bodyBudgetCallerPercent: int(1, 100)
      .default(50)
      .meta({
        description:
          'The share of `bodyBudgetBytes` one caller may hold, in percent: past it that caller ' +
          'is refused with 429 (`*_caller_budget_exceeded`) while others still get through.',
        env: 'ORDERS_BODY_BUDGET_CALLER_PERCENT',
      }),
    maxInFlightPerCaller: int(0, 100_000)
      .default(64)
      .meta({
        description:
          'Orders one caller may have in progress on this replica at once, ' +
          'its body being read included; past it 429 ' +
          '`order_caller_budget_exceeded` with `Retry-After`. `0`: no bound.',
        env: 'ORDERS_MAX_IN_FLIGHT_PER_CALLER',
      }),
    clientRatePerSecond: int(0, 100_000)
      .default(100)
      .meta({
        description:
          'Orders per second per client, all callers together, ' +
          'fleet-wide (per replica without Redis); `0`: no limit.',
        env: 'ORDERS_CLIENT_RATE_PER_SECOND',
      }),
    clientRateBurst: int(0, 1_000_000).default(200).meta({
      description: 'Extra orders per client allowed above its rate within any 10-second window.',
      env: 'ORDERS_CLIENT_RATE_BURST',
    }),
    callerRatePerSecond: int(0, 100_000).default(50).meta({
      description: 'Orders per second per (client, caller), fleet-wide; `0`: no limit.',
      env: 'ORDERS_CALLER_RATE_PER_SECOND',
    }),
    callerRateBurst: int(0, 1_000_000).default(100).meta({
      description:
        'Extra orders per (client, caller) allowed above its rate within any 10-second window.',
      env: 'ORDERS_CALLER_RATE_BURST',
    }),
    maxIdempotencyRecordsPerCaller: int(0, 10_000_000)
      .default(100_000)
      .meta({
        description:
          'Most order `Idempotency-Key` records one caller may hold per client at once (kept ' +
          '`idempotencyTtlSeconds`); past it a keyed order is refused (429 ' +
          '`idempotency_records_exceeded`, nothing sent) until its oldest record expires. `0`: ' +
          'no bound.',
        env: 'ORDERS_IDEMPOTENCY_MAX_RECORDS_PER_CALLER',
      }),
    maxIdempotencyBytesPerCaller: int(0, 68_719_476_736)
      .default(67_108_864)
      .meta({
        description:
          'Most bytes of order `Idempotency-Key` records one caller may hold per ' +
          'client at once in the store (Redis): each record counts its stored answer ' +
          'plus 512 bytes. Past it a keyed order is refused (429 ' +
          '`idempotency_bytes_exceeded`, nothing sent) until records expire; orders ' +
          'in flight when it is reached may pass it by their answers. `0`: no bound.',
        defaultText: '67108864 (64 MiB)',
        env: 'ORDERS_IDEMPOTENCY_MAX_BYTES_PER_CALLER',
      }),
  })
  .strict();

/** `/provider/<client>/...`: limits of the passthrough. Timeouts and the pool are the orders ones. */
export const forwardSettingsSchema = z
  .object({
    bodyLimitBytes: int(1024, 16_777_216)
      .default(1_048_576)
      .meta({
        description:
          'Largest request body forwarded; a larger one is refused with 413. Request ' +
          'bodies are held until the call ends (a 401 is retried with the same bytes).',
        defaultText: '1048576 (1 MiB)',
        env: 'FORWARD_BODY_LIMIT_BYTES',
      }),
    maxResponseBytes: int(1024, 4_294_967_296).default(67_108_864).meta({
      description: 'Largest provider answer relayed; it streams, and is cut off past this.',
      defaultText: '67108864 (64 MiB)',
      env: 'FORWARD_MAX_RESPONSE_BYTES',
    }),
    maxStoredResponseBytes: int(1024, 16_777_216)
      .default(1_048_576)
      .meta({
        description:
          'Largest answer to a request with an `Idempotency-Key`: such an answer is collected ' +
          'whole to be stored for replays; a larger one is 502 and its outcome unknown.',
        defaultText: '1048576 (1 MiB)',
        env: 'FORWARD_MAX_STORED_RESPONSE_BYTES',
      }),
    idempotencyTtlSeconds: int(60, 30 * 86_400)
      .default(3600)
      .meta({
        description:
          'How long the outcome of a passthrough request sent with an ' +
          '`Idempotency-Key` is kept for replays and conflicts: shorter ' +
          "than an order's, since any allowed call may store one.",
        defaultText: '3600 (1 h)',
        env: 'FORWARD_IDEMPOTENCY_TTL_SECONDS',
      }),
    maxIdempotencyRecordsPerCaller: int(0, 10_000_000)
      .default(10_000)
      .meta({
        description:
          'Most passthrough `Idempotency-Key` records one caller may hold per client at ' +
          'once; past it a keyed request is refused (429 `idempotency_records_exceeded`, ' +
          'nothing sent) until its oldest record expires. `0`: no bound.',
        env: 'FORWARD_IDEMPOTENCY_MAX_RECORDS_PER_CALLER',
      }),
    maxIdempotencyBytesPerCaller: int(0, 68_719_476_736)
      .default(16_777_216)
      .meta({
        description:
          'Most bytes of passthrough `Idempotency-Key` records one caller may hold per ' +
          'client at once in the store (Redis): each record counts its stored answer plus ' +
          '512 bytes. Past it a keyed request is refused (429 `idempotency_bytes_exceeded`, ' +
          'nothing sent) until records expire; requests in flight when it is reached may ' +
          'pass it by their answers (at most `maxStoredResponseBytes` each). `0`: no bound.',
        defaultText: '16777216 (16 MiB)',
        env: 'FORWARD_IDEMPOTENCY_MAX_BYTES_PER_CALLER',
      }),
    maxInFlightPerCaller: int(0, 100_000)
      .default(64)
      .meta({
        description:
          'Passthrough requests one caller may have in progress on this replica at ' +
          "once, from the body being read to the answer's last byte; past it 429 " +
          '`forward_caller_budget_exceeded` with `Retry-After`. `0`: no bound.',
        env: 'FORWARD_MAX_IN_FLIGHT_PER_CALLER',
      }),
    clientRatePerSecond: int(0, 100_000)
      .default(100)
      .meta({
        description:
          'Requests per second per client, all callers together, ' +
          'fleet-wide (per replica without Redis); `0`: no limit.',
        env: 'FORWARD_CLIENT_RATE_PER_SECOND',
      }),
    clientRateBurst: int(0, 1_000_000).default(200).meta({
      description: 'Extra requests per client allowed above its rate within any 10-second window.',
      env: 'FORWARD_CLIENT_RATE_BURST',
    }),
    callerRatePerSecond: int(0, 100_000).default(50).meta({
      description: 'Requests per second per (client, caller), fleet-wide; `0`: no limit.',
      env: 'FORWARD_CALLER_RATE_PER_SECOND',
    }),
    callerRateBurst: int(0, 1_000_000)
      .default(100)
      .meta({
        description:
          'Extra requests per (client, caller) allowed ' +
          'above its rate within any 10-second window.',
        env: 'FORWARD_CALLER_RATE_BURST',
      }),
  })
  .strict();
export type ForwardSettings = z.infer<typeof forwardSettingsSchema>;

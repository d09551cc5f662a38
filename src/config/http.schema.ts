import { z } from 'zod';
import { flag, httpUrl, int, issuesOf } from './schema-parts';

/**
 * The admin listener's port: `adminPort`, else the deprecated `metricsPort`; `undefined` when
 * one listener serves everything.
 */
export function adminPortOf(http: {
  adminPort?: number | undefined;
  metricsPort?: number | undefined;
}): number | undefined {
  return http.adminPort ?? http.metricsPort;
}

export const httpSettingsSchema = z
  .object({
    port: int(0, 65_535).default(8080).meta({ env: 'PORT' }),
    host: z.string().min(1).default('0.0.0.0').meta({ env: 'HOST' }),
    shutdownDrainDelayMs: int(0, 120_000)
      .default(0)
      .meta({
        description:
          'On SIGTERM, how long the replica keeps serving (answering readiness 503 and every ' +
          'request with `Connection: close`) before it stops accepting connections: the time ' +
          'the endpoints controller and kube-proxy need to stop sending it traffic.',
        env: 'SHUTDOWN_DRAIN_DELAY_MS',
      }),
    shutdownGraceMs: int(0, 300_000).default(10_000).meta({
      description: 'Grace period for in-flight requests once the listener stops.',
      env: 'SHUTDOWN_GRACE_MS',
    }),
    headersTimeoutMs: int(500, 120_000).default(10_000).meta({
      description:
        "Most time to receive a request's line and headers (slowloris): then 408 and close.",
      env: 'HTTP_HEADERS_TIMEOUT_MS',
    }),
    requestTimeoutMs: int(500, 300_000).default(30_000).meta({
      description: 'Most time to receive a whole request, body included: then 408 and close.',
      env: 'HTTP_REQUEST_TIMEOUT_MS',
    }),
    adminPort: int(1, 65_535)
      .optional()
      .meta({
        description:
          'The admin listener: `/metrics`, `/health/*` and `/admin/*` on their own port, so ' +
          'that a NetworkPolicy admits Prometheus, the kubelet and operators there and keeps ' +
          'callers out. `port` then answers 404 for `/metrics` and `/admin/*` (it keeps ' +
          '`/health/*`: plain `docker run` and probes written for one port keep working). ' +
          'Unset: one listener serves everything (local development, the sandbox).',
        env: 'ADMIN_PORT',
      }),
    metricsPort: int(1, 65_535)
      .optional()
      .meta({
        description:
          'Deprecated alias of `adminPort` (`METRICS_PORT`, which served `/metrics` alone): ' +
          'taken as the admin port when `adminPort` is unset, with a warning at start-up.',
        env: 'METRICS_PORT',
      }),
    keepAliveTimeoutMs: int(100, 600_000).default(5000).meta({
      description: 'How long an idle keep-alive connection stays open.',
      env: 'HTTP_KEEP_ALIVE_TIMEOUT_MS',
    }),
    issuer: httpUrl
      .refine((v) => !/[?#]/.test(v), { message: 'must have no query or fragment (RFC 8414)' })
      .optional()
      .meta({
        description:
          "The broker's OAuth issuer (`OAUTH_ISSUER`): the origin callers reach it " +
          'at, e.g. `https://token-broker.shop.svc`, from which the RFC 8414 ' +
          'metadata builds its URLs. Set it wherever the Host header is not trusted: ' +
          'otherwise any caller picks the URLs it is sent (production warns at ' +
          "start-up without it; the Helm chart sets its Service's DNS name).",
        defaultText: "the request's origin (scheme and Host)",
        env: 'OAUTH_ISSUER',
      }),
  })
  .strict()
  .superRefine((h, ctx) => {
    const issue = issuesOf(ctx);
    if (h.metricsPort === h.port) {
      issue(['metricsPort'], 'metricsPort (METRICS_PORT) must differ from port (PORT)');
    }
    if (h.adminPort === h.port) {
      issue(['adminPort'], 'adminPort (ADMIN_PORT) must differ from port (PORT)');
    }
    if (h.adminPort !== undefined && h.metricsPort !== undefined && h.adminPort !== h.metricsPort) {
      issue(
        ['metricsPort'],
        'metricsPort (METRICS_PORT) is the deprecated name of adminPort (ADMIN_PORT): set ADMIN_PORT only',
      );
    }
    if (h.headersTimeoutMs > h.requestTimeoutMs) {
      issue(
        ['headersTimeoutMs'],
        'headersTimeoutMs (HTTP_HEADERS_TIMEOUT_MS) must not exceed requestTimeoutMs (HTTP_REQUEST_TIMEOUT_MS)',
      );
    }
  });

export const logSettingsSchema = z
  .object({
    level: z
      .enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])
      .default('info')
      .meta({ env: 'LOG_LEVEL' }),
  })
  .strict();

/**
 * The token audit trail: who received which token, when and how often (see docs/security.md,
 * "Audit trail").
 */
export const auditSettingsSchema = z
  .object({
    intervalSeconds: int(1, 3600)
      .default(10)
      .meta({
        description:
          'Issued tokens are written as one line per caller, client and token fingerprint per ' +
          'this many seconds, with the count, the first and last time and a few request ids.',
        env: 'AUDIT_INTERVAL_SECONDS',
      }),
    perRequest: flag.default(false).meta({
      description:
        'One line per token handed out (with its request id) instead of one per interval.',
      env: 'AUDIT_PER_REQUEST',
    }),
    refusalsPerSecond: int(1, 1_000_000)
      .default(100)
      .meta({
        description:
          'Refusals (401, 403, 404, bad input) are one line each, at most this many a ' +
          'second; the rest are counted in a later `token refusals suppressed` line.',
        env: 'AUDIT_REFUSALS_PER_SECOND',
      }),
  })
  .strict();

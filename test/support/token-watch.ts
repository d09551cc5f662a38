import { get } from 'node:http';
import type { IssuedToken, ProviderEmulator } from '../../emulator/provider-emulator';
import { waitFor } from './wait';
import type { HammerResponse, HammerResult } from './load';

/** The broker never hands out a token with less than this left (`MIN_SERVE_MS`). */
export const MIN_SERVE_MS = 1000;

/** `GET /token`'s 200 body. */
export interface TokenBody {
  access_token: string;
  token_type: string;
  expires_in: number;
  expires_at: string;
}

/** A non-200 answer, kept to decide afterwards whether a valid token existed at the time. */
export interface Refusal {
  url: string;
  status: number;
  /** When the request was sent (epoch ms). */
  sentAt: number;
  receivedAt: number;
  retryAfter?: string;
  contentType?: string;
  code?: string;
  detail?: string;
}

/**
 * Watches `GET /token` answers during a fault scenario, as a {@link hammer} `validate`
 * function: every 200 must carry a token the provider issued, not expired on receipt; every
 * other answer is recorded as a {@link Refusal} so the test can tell a refusal while a valid
 * token existed (a failure) from one after every token had expired (the expected 503).
 */
export class TokenWatch {
  /**
   * Every distinct token served: when the provider issued it and when it expires (epoch ms, as
   * the provider has them), and when a caller first received it.
   */
  readonly served = new Map<
    string,
    { issuedAt: number; expiresAt: number; firstServedAt: number }
  >();
  readonly refusals: Refusal[] = [];
  /** Serving time of each token, per broker URL: the last one seen. */
  readonly lastServedBy = new Map<string, { token: string; at: number }>();
  ok = 0;

  constructor(private readonly emulator: ProviderEmulator) {}

  /** Pass as `hammer({ validate })`. */
  readonly validate = (res: HammerResponse): string | null => {
    const sentAt = res.receivedAt - res.latencyMs;
    if (res.status !== 200) {
      this.refusals.push(refusalOf(res, sentAt));
      return null;
    }
    const body = JSON.parse(res.body) as TokenBody;
    const expiresAt = Date.parse(body.expires_at);
    if (!(expiresAt > res.receivedAt)) return `expired token served by ${res.url}`;
    let grant = this.served.get(body.access_token);
    if (grant === undefined) {
      const issued = this.emulator.stats.issued.find((g) => g.token === body.access_token);
      if (!issued) return `${res.url} served a token the provider never issued`;
      grant = {
        issuedAt: issued.issuedAt,
        expiresAt: issued.expiresAt,
        firstServedAt: res.receivedAt,
      };
      this.served.set(body.access_token, grant);
    }
    const providerExpiry = grant.expiresAt;
    if (providerExpiry <= res.receivedAt) {
      return `${res.url} served a token past the provider's expiry`;
    }
    // The broker counts from when it sent the request, so it never believes in more time
    // than the provider gave (a little slack for rounding to whole seconds).
    if (expiresAt > providerExpiry + 5)
      return `${res.url} claims a later expiry than the provider's`;
    this.ok++;
    this.lastServedBy.set(res.url, { token: body.access_token, at: res.receivedAt });
    return null;
  };

  /**
   * Refusals of requests sent while the fleet had a valid token: one that a caller had already
   * been given and that still had more than the broker's minimum serving time left. `slackMs`
   * covers both ends: a new token takes a few milliseconds to reach every replica (Redis write,
   * pub/sub), and a loaded machine schedules late. Those refusals are failures in every scenario.
   */
  refusalsWhileValid(slackMs = 250): Refusal[] {
    const grants = [...this.served.values()];
    return this.refusals.filter((r) =>
      grants.some(
        (g) =>
          g.firstServedAt + slackMs < r.sentAt && g.expiresAt - r.sentAt > MIN_SERVE_MS + slackMs,
      ),
    );
  }
}

function refusalOf(res: HammerResponse, sentAt: number): Refusal {
  const refusal: Refusal = {
    url: res.url,
    status: res.status,
    sentAt,
    receivedAt: res.receivedAt,
    retryAfter: header(res, 'retry-after'),
    contentType: header(res, 'content-type'),
  };
  try {
    const problem = JSON.parse(res.body) as { code?: string; detail?: string };
    refusal.code = problem.code;
    refusal.detail = problem.detail;
  } catch {
    // Not JSON (Fastify's own shutdown 503, for instance): the status says enough.
  }
  return refusal;
}

function header(res: HammerResponse, name: string): string | undefined {
  const v = res.headers[name];
  return Array.isArray(v) ? v.join(', ') : v;
}

/** One line of figures for the scenario report. */
export function figures(
  name: string,
  result: HammerResult,
  extra: Record<string, string | number>,
): string {
  const parts = [
    `calls=${result.calls}`,
    `transportFailures=${result.failureCount}`,
    `invalid=${result.validationErrorCount}`,
    `maxLatencyMs=${Math.round(result.maxLatencyMs)}`,
    ...Object.entries(extra).map(([k, v]) => `${k}=${v}`),
  ];
  return `[fault:${name}] ${parts.join(' ')}`;
}

/**
 * Sum of a Prometheus counter or gauge on a broker's `/metrics`, over the series whose labels
 * include every given one. 0 when the series does not exist yet.
 */
export async function metricValue(
  baseUrl: string,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  const text = await httpText(`${baseUrl}/metrics`);
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const series = m[2] ?? '';
    if (Object.entries(labels).every(([k, v]) => series.includes(`${k}="${v}"`))) {
      sum += Number(m[3]);
    }
  }
  return sum;
}

/** Status and body of one GET, without keep-alive (nothing left to keep Jest alive). */
export async function httpGet(
  url: string,
  timeoutMs = 3000,
): Promise<{
  status: number;
  body: string;
  headers: Record<string, string | string[] | undefined>;
}> {
  return new Promise((resolve, reject) => {
    const req = get(url, { agent: false, timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.once('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
      res.once('error', reject);
    });
    req.once('timeout', () => req.destroy(new Error(`GET ${url} timed out`)));
    req.once('error', reject);
  });
}

async function httpText(url: string): Promise<string> {
  const res = await httpGet(url);
  if (res.status !== 200) throw new Error(`GET ${url} answered ${res.status}`);
  return res.body;
}

/** The token a broker serves right now (min_ttl 0), or undefined on any error. */
export async function currentToken(baseUrl: string, client: string): Promise<string | undefined> {
  try {
    const res = await httpGet(`${baseUrl}/token?client=${client}`);
    return res.status === 200 ? (JSON.parse(res.body) as TokenBody).access_token : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Waits for the provider's next token grant after this call and returns it: the moment right
 * after a refresh, which the fault scenarios time their faults from.
 * @param intervalMs Pause between two looks, so also how late after the grant this may
 *   resolve: shorter where a scenario times its next step from that moment. @default 20
 */
export function nextRefresh(
  emulator: ProviderEmulator,
  timeoutMs: number,
  intervalMs?: number,
): Promise<IssuedToken> {
  const issuedBefore = emulator.stats.tokensIssued;
  return waitFor(
    () => (emulator.stats.tokensIssued > issuedBefore ? emulator.stats.issued.at(-1) : undefined),
    { timeoutMs, intervalMs, what: 'a refresh' },
  );
}

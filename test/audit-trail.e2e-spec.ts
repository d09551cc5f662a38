import { hammer } from './support/load';
import { waitFor } from './support/wait';
import {
  type CallerBrokers,
  fingerprint,
  newKey,
  startCallerBrokers,
} from './support/caller-brokers';

jest.setTimeout(60_000);

/**
 * The token audit trail of a real broker process (`node dist/main.js`): aggregated `token
 * issued` lines must account for every token handed out, also at SIGTERM under load, and a
 * flood of refusals must be rate-limited without a refusal going unaccounted for.
 */
describe('token audit trail', () => {
  let set: CallerBrokers;

  beforeAll(async () => {
    set = await startCallerBrokers({
      name: 'audit',
      unavailableClient: false,
      env: {
        // Nothing on the timer during the test: the lines come from the shutdown flush.
        AUDIT_INTERVAL_SECONDS: '3600',
        AUDIT_REFUSALS_PER_SECOND: '20',
        LOG_LEVEL: 'info',
      },
    });
  });

  afterAll(async () => {
    await set?.stop();
  });

  const auditLines = () =>
    set.apiKeyBroker
      .logs()
      .filter((l) => l.includes('"audit":"token"'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);

  it('writes refusals one by one up to the rate and counts the rest in a later line', async () => {
    const result = await hammer({
      urls: [set.apiKeyBroker.url],
      path: '/token?client=acme-prod',
      headers: { authorization: `Bearer ${newKey()}` },
      concurrency: 8,
      durationMs: 1500,
      isSuccess: (status) => status === 401,
    });
    expect(result.failureCount).toBe(0);
    const refused = result.byStatus[401];
    expect(refused).toBeGreaterThan(100);
    // A refusal more than a second later is admitted and reports what was left out first.
    await new Promise((resolve) => setTimeout(resolve, 1100));
    const lateAt = Date.now() - 5;
    expect((await fetch(`${set.apiKeyBroker.url}/token`)).status).toBe(401);

    // The late refusal's own line comes right after the summary of what it follows.
    const late = await waitForLine(
      (l) =>
        l.msg === 'token refused' &&
        l.result === 'unauthenticated' &&
        Date.parse(l.time as string) >= lateAt,
    );
    const lines = auditLines();
    const written = lines.filter((l) => l.msg === 'token refused');
    const summaries = lines.filter((l) => l.msg === 'token refusals suppressed');
    expect(late).toBeDefined();
    expect(summaries.length).toBeGreaterThanOrEqual(1);
    let suppressed = 0;
    for (const s of summaries) {
      expect(s).toMatchObject({ level: 'info', results: { unauthenticated: s.suppressed } });
      suppressed += s.suppressed as number;
    }
    // 1.5 s of flood: at most two one-second windows of 20, then the late refusal.
    expect(written.length).toBeLessThanOrEqual(2 * 20 + 1);
    expect(written.length + suppressed).toBe(refused + 1);
    expect(written.every((l) => typeof l.reqId === 'string')).toBe(true);
  });

  it('lets no unauthenticated flood hide a caller’s refusal, and names callers it counts', async () => {
    const url = set.apiKeyBroker.url;
    const get = (key: string, query: string) =>
      fetch(`${url}/token?${query}`, { headers: { authorization: `Bearer ${key}` } });
    const statuses = async (n: number, key: () => string, query: string) =>
      Promise.all(
        Array.from({ length: n }, async () => {
          const res = await get(key(), query);
          await res.arrayBuffer();
          return res.status;
        }),
      );
    // Twice the second's budget of unauthenticated refusals, then a real caller's 403.
    expect(new Set(await statuses(40, newKey, 'client=acme-prod'))).toEqual(new Set([401]));
    const forbidden = await get(set.keys.checkout, 'client=globex-prod');
    expect(forbidden.status).toBe(403);
    const { requestId } = (await forbidden.json()) as { requestId: string };
    const line = await waitForLine((l) => l.msg === 'token refused' && l.reqId === requestId);
    expect(line).toMatchObject({ caller: 'checkout', client: 'globex-prod', result: 'forbidden' });
    // The caller's own loop is limited by its own budget, and the summary says whose it was.
    await statuses(45, () => set.keys.checkout, 'client=globex-prod');
    // Another caller's refusal: admitted, it brings the summary before its own line.
    expect((await statuses(1, () => set.keys.ops, 'client=acme-prod&min_ttl=abc'))[0]).toBe(400);
    const summary = await waitForLine(
      (l) =>
        l.msg === 'token refusals suppressed' &&
        typeof (l.callers as Record<string, number> | undefined)?.checkout === 'number',
    );
    const counted = (summary.callers as Record<string, number>).checkout;
    expect(counted).toBeGreaterThan(0);
    expect(summary).toMatchObject({
      clients: { 'globex-prod': counted },
      results: { forbidden: counted },
    });
  });

  /**
   * Three times a second's budget (20) of unauthenticated refusals, then a real caller's 403 and
   * another caller's 404: at most two windows of the flood are written, the rest are counted in
   * `<msg> refusals suppressed`, and the caller's own refusal is kept.
   */
  async function expectRefusalsBudgeted(
    audit: string,
    msg: string,
    send: (key: string, client: string) => Promise<number>,
  ): Promise<void> {
    const auditLinesOf = () =>
      set.apiKeyBroker
        .logs()
        .filter((l) => l.includes(`"audit":"${audit}"`))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    const before = auditLinesOf().length;
    const flood = await Promise.all(Array.from({ length: 60 }, () => send(newKey(), 'acme-prod')));
    expect(new Set(flood)).toEqual(new Set([401]));
    expect(await send(set.keys.checkout, 'globex-prod')).toBe(403);
    // Another caller's refusal brings the summary of what was left out.
    expect(await send(set.keys.ops, 'nobody')).toBe(404);
    const summary = await waitFor(
      () => auditLinesOf().find((l) => l.msg === `${msg} refusals suppressed`),
      { timeoutMs: 5000, what: 'the summary line' },
    );
    const lines = auditLinesOf().slice(before);
    const unauthenticated = lines.filter((l) => l.msg === msg && l.result === 'unauthenticated');
    // At most two one-second windows of 20 (a busy machine may straddle one).
    expect(unauthenticated.length).toBeLessThanOrEqual(40);
    expect(summary).toMatchObject({ results: { unauthenticated: 60 - unauthenticated.length } });
    expect(lines).toContainEqual(
      expect.objectContaining({ msg, caller: 'checkout', client: 'globex-prod' }),
    );
  }

  it('passthrough refusals have the same budget: counted by kind, a caller’s refusal kept', async () => {
    await expectRefusalsBudgeted('forward', 'forward', async (key, client) => {
      const res = await fetch(
        `${set.apiKeyBroker.url}/provider/${client}/api/marketing/v1/offers`,
        {
          headers: { authorization: `Bearer ${key}` },
        },
      );
      await res.arrayBuffer();
      return res.status;
    });
  });

  it('order refusals have the same budget: counted by kind, a caller’s refusal kept', async () => {
    await expectRefusalsBudgeted('orders', 'order', async (key, client) => {
      const res = await fetch(`${set.apiKeyBroker.url}/orders?client=${client}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: '{}',
      });
      await res.arrayBuffer();
      return res.status;
    });
  });

  it('logs the broker’s own request id as reqId, the caller’s beside it', async () => {
    const url = set.apiKeyBroker.url;
    const forged = 'forged-request-id';
    const refusal = async (path: string, msg: string) => {
      // Twice the same X-Request-Id: two requests, two ids in the trail.
      const bodies = await Promise.all(
        [1, 2].map(async () => {
          const res = await fetch(`${url}${path}`, {
            headers: { authorization: `Bearer ${set.keys.ops}`, 'x-request-id': forged },
          });
          expect(res.status).toBeGreaterThanOrEqual(400);
          // The answer still echoes the caller's id; its problem names the broker's.
          expect(res.headers.get('x-request-id')).toBe(forged);
          return (await res.json()) as { requestId: string };
        }),
      );
      const ids = bodies.map((b) => b.requestId);
      expect(new Set(ids).size).toBe(2);
      expect(ids).not.toContain(forged);
      for (const id of ids) {
        const line = await waitForAnyLine((l) => l.msg === msg && l.reqId === id);
        expect(line).toMatchObject({ caller: 'ops', callerRequestId: forged });
      }
    };
    // A caller whose refusal budgets earlier tests left untouched.
    await refusal('/token?client=acme-prod&min_ttl=abc', 'token refused');
    await refusal('/provider/nobody/api/marketing/v1/offers', 'forward');
  });

  it('accounts for every token handed out, through a SIGTERM under load', async () => {
    const broker = set.apiKeyBroker;
    const issuedFps = new Map<string, number>();
    let exited = false;
    const load = hammer({
      urls: [broker.url],
      path: '/token?client=acme-prod',
      headers: { authorization: `Bearer ${set.keys.checkout}` },
      concurrency: 16,
      until: () => exited,
      durationMs: 20_000,
      requestTimeoutMs: 3000,
      // Answers while closing are 503 and connections are refused after: not tokens.
      isSuccess: () => true,
      validate: (res) => {
        if (res.status !== 200) return null;
        const fp = fingerprint((JSON.parse(res.body) as { access_token: string }).access_token);
        issuedFps.set(fp, (issuedFps.get(fp) ?? 0) + 1);
        return null;
      },
    });
    await new Promise((resolve) => setTimeout(resolve, 1500));
    const exit = await broker.kill('SIGTERM');
    exited = true;
    const result = await load;
    expect(exit).toMatchObject({ code: 0 });
    expect(result.validationErrorCount).toBe(0);
    const answered = result.byStatus[200] ?? 0;
    expect(answered).toBeGreaterThan(500);

    const issuedLines = auditLines().filter(
      (l) => l.msg === 'token issued' && l.caller === 'checkout',
    );
    const audited = new Map<string, number>();
    for (const l of issuedLines) {
      expect(l).toMatchObject({ client: 'acme-prod', result: 'issued' });
      expect((l.reqIds as string[]).length).toBeGreaterThanOrEqual(1);
      audited.set(l.fp as string, (audited.get(l.fp as string) ?? 0) + (l.count as number));
    }
    expect(audited).toEqual(issuedFps);
    // Aggregated: a handful of lines for hundreds of tokens.
    expect(issuedLines.length).toBeLessThanOrEqual(issuedFps.size * 2);
  });

  /** Polls every audit line (token, orders, passthrough) until one matches. */
  async function waitForAnyLine(
    match: (line: Record<string, unknown>) => boolean,
  ): Promise<Record<string, unknown>> {
    const lines = () =>
      set.apiKeyBroker
        .logs()
        .filter((l) => l.includes('"audit":'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    return waitFor(() => lines().find(match), { timeoutMs: 5000, what: 'the audit line' });
  }

  /** Polls the audit lines until one matches. */
  async function waitForLine(
    match: (line: Record<string, unknown>) => boolean,
  ): Promise<Record<string, unknown>> {
    return waitFor(() => auditLines().find(match), { timeoutMs: 5000, what: 'the audit line' });
  }
});

import type { SecretsManagerEmulator } from '../../emulator/secrets-manager-emulator';
import { startFaultFleet, startTokenLoad } from '../support/fault-fleet';
import { type Fleet, FLEET_CLIENT, FLEET_CREDENTIALS } from '../support/fleet';
import { figures, httpGet } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

const LIFETIME_S = 4;
const AHEAD_S = 2;
/** Where the fleet's Secrets Manager emulator keeps the client's credentials. */
const SECRET_ID = `token-broker/${FLEET_CLIENT}`;
const ROTATED = { client_id: FLEET_CREDENTIALS.client_id, client_secret: 'rotated-secret-two' };
const UNKNOWN = { client_id: FLEET_CREDENTIALS.client_id, client_secret: 'secret-nobody-has' };

interface Readiness {
  status: number;
  tokens?: {
    status: string;
    clients: Array<{ error?: string; detail?: string; hasToken: boolean }>;
  };
}

/**
 * Design: `invalid_client` from the auth server means "reload the credentials once (they may
 * have been rotated), then fail loudly". Credentials come from Secrets Manager (the real AWS SDK
 * against the emulator), so a rotation needs no restart; with no valid secret anywhere,
 * readiness and the 503s say what to check.
 */
describe('credential rotation through Secrets Manager', () => {
  let secrets: SecretsManagerEmulator;
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = await startFaultFleet({
      admin: true,
      secrets: 'secrets-manager',
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      env: {
        TOKEN_BACKOFF_BASE_MS: '100',
        TOKEN_BACKOFF_MAX_MS: '1000',
        TOKEN_WAIT_TIMEOUT_MS: '500',
      },
    });
    secrets = fleet.secrets!;
  }, 30_000);

  afterAll(async () => {
    await fleet?.stop();
  }, 30_000);

  /** The readiness report of the broker at `url`, from its admin listener. */
  async function readiness(url: string): Promise<Readiness> {
    const admin = fleet.brokers.find((b) => b.url === url)!.adminUrl!;
    const res = await httpGet(`${admin}/health/ready`);
    const body = JSON.parse(res.body) as { details?: { tokens?: Readiness['tokens'] } };
    return { status: res.status, tokens: body.details?.tokens };
  }

  async function nextIssued(after: number) {
    return waitFor(() => fleet.emulator.stats.issued.find((g) => g.issuedAt > after), {
      timeoutMs: LIFETIME_S * 2000,
      intervalMs: 10,
      what: 'a new token from the provider',
    });
  }

  it('recovers from a rotation without restart, and says what to check when no secret works', async () => {
    const { emulator, brokers } = fleet;
    const load = startTokenLoad(fleet, { concurrency: 6 });
    const { urls, watch } = load;
    try {
      // Phase 1: rotation. Secrets Manager serves the new secret, the provider takes only it.
      const steady = await nextIssued(Date.now());
      const rejectedBefore = emulator.stats.rejectedTokenAuth;
      secrets.setSecret(SECRET_ID, JSON.stringify(ROTATED));
      emulator.setCredentials({ [ROTATED.client_id]: ROTATED.client_secret });
      const rotatedAt = Date.now();
      const afterRotation = await nextIssued(rotatedAt);
      await waitFor(
        () => urls.every((u) => watch.lastServedBy.get(u)?.token === afterRotation.token),
        { timeoutMs: 3000, what: 'every replica to serve the token got with the rotated secret' },
      );
      const rejectedByRotation = emulator.stats.rejectedTokenAuth - rejectedBefore;
      const rotationMsBeforeExpiry = steady.expiresAt - afterRotation.issuedAt;

      // Phase 2: no valid secret anywhere. While the token lasts, callers are served and
      // readiness stays up but names the problem; after expiry, 503s and readiness say what to
      // check.
      await nextIssued(Date.now());
      const last = emulator.stats.issued.at(-1)!;
      emulator.setCredentials({ [UNKNOWN.client_id]: UNKNOWN.client_secret });
      const whileValid = await waitFor(
        async () => {
          const r = await readiness(urls[0]);
          return r.tokens?.clients[0]?.error === 'credentials_rejected' ? r : undefined;
        },
        { timeoutMs: LIFETIME_S * 1000, what: 'readiness to report the refused credentials' },
      );
      const reportedWhileValidAt = Date.now();
      await delay(Math.max(0, last.expiresAt - Date.now()));
      // Every replica has tried (and been refused) by now or shortly after.
      const rejectedReady = await waitFor(
        async () => {
          const all = await Promise.all(urls.map(readiness));
          return all.every(
            (r) => r.status === 503 && r.tokens?.clients[0]?.error === 'credentials_rejected',
          )
            ? all
            : undefined;
        },
        { timeoutMs: 5000, what: 'every replica to be unready for refused credentials' },
      );
      const refusalsRejected = watch.refusals.length;

      secrets.deleteSecret(SECRET_ID);
      const missingReady = await waitFor(
        async () => {
          const r = await readiness(urls[0]);
          return r.tokens?.clients[0]?.error === 'credentials_unavailable' ? r : undefined;
        },
        { timeoutMs: 5000, what: 'readiness to report the missing secret' },
      );
      await waitFor(() => watch.refusals.some((r) => r.code === 'credentials_unavailable'), {
        timeoutMs: 3000,
        what: 'callers to be told the secret is missing',
      });

      // Phase 3: the operator stores the right secret; the fleet recovers on its own.
      secrets.setSecret(SECRET_ID, JSON.stringify(UNKNOWN));
      const fixedAt = Date.now();
      const recovered = await nextIssued(fixedAt);
      await waitFor(
        () => urls.every((u) => (watch.lastServedBy.get(u)?.at ?? 0) > recovered.issuedAt),
        { timeoutMs: 5000, what: 'every replica to serve again' },
      );
      await waitFor(
        async () => (await Promise.all(urls.map(readiness))).every((r) => r.status === 200),
        { timeoutMs: 3000, what: 'every replica to be ready again' },
      );
      const result = await load.stop();

      const outputs = [
        ...brokers.flatMap((b) => b.logs()),
        ...watch.refusals.map((r) => r.detail ?? ''),
        JSON.stringify([whileValid, rejectedReady, missingReady]),
      ].join('\n');
      const leaked = [FLEET_CREDENTIALS, ROTATED, UNKNOWN].filter((c) =>
        outputs.includes(c.client_secret),
      );
      const codes = [...new Set(watch.refusals.map((r) => r.code))];
      console.log(
        figures('credential-rotation', result, {
          refusalsWhileValid: watch.refusalsWhileValid().length,
          refusalsAfterExpiry: watch.refusals.length,
          refusalCodes: codes.join('+'),
          providerRequests: emulator.stats.tokenRequests,
          rejectedByRotation,
          rotationMsBeforeExpiry,
          recoveryMsAfterFix: recovered.issuedAt - fixedAt,
          secretsManagerReads: secrets.stats.requests,
        }),
      );
      console.log(
        `[fault:credential-rotation] rejected: ${rejectedReady[0].tokens?.clients[0]?.detail}`,
      );
      console.log(
        `[fault:credential-rotation] missing: ${missingReady.tokens?.clients[0]?.detail}`,
      );

      expect(result.calls).toBeGreaterThan(1000);
      expect(result.failures).toEqual([]);
      expect(result.validationErrors).toEqual([]);
      expect(watch.refusalsWhileValid()).toEqual([]);
      // Rotation: at most one refused request per replica (a replica that never fetched reads
      // the new secret on its first fetch and is not refused at all), and no caller noticed.
      expect(rejectedByRotation).toBeLessThanOrEqual(urls.length);
      expect(rotationMsBeforeExpiry).toBeGreaterThan(1000);
      // A replica that still holds a valid token stays ready and names the problem.
      expect(whileValid.status).toBe(200);
      expect(reportedWhileValidAt).toBeLessThan(last.expiresAt - 1000);
      // Once it expired: not ready, and both the readiness detail and the 503 say what to check.
      for (const r of rejectedReady) {
        expect(r.status).toBe(503);
        expect(r.tokens?.clients[0]).toMatchObject({
          error: 'credentials_rejected',
          hasToken: false,
        });
        expect(r.tokens?.clients[0]?.detail).toMatch(/check the client id\/secret/);
        expect(r.tokens?.clients[0]?.detail).toContain(SECRET_ID);
      }
      expect(refusalsRejected).toBeGreaterThan(0);
      expect(missingReady.status).toBe(503);
      expect(missingReady.tokens?.clients[0]?.detail).toMatch(/not found; check the name\/ARN/);
      expect(codes.sort()).toEqual(['credentials_rejected', 'credentials_unavailable']);
      for (const r of watch.refusals) {
        expect(r.status).toBe(503);
        expect(r.retryAfter).toMatch(/^[1-9]\d*$/);
        expect(r.detail).toMatch(/check the/);
      }
      expect(leaked).toEqual([]);
    } finally {
      await load.stop();
    }
  }, 60_000);
});

import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { type Stack, startStack } from './support/stack';

// In-process brokers and an emulator: more than Jest's 5 s on a shared machine.
jest.setTimeout(60_000);

const CALLERS = {
  shop: { clients: ['acme-prod'], scopes: ['token', 'forward'] },
  'acme-ops': { clients: ['acme-prod'], scopes: ['admin'] },
  prometheus: { clients: ['*'], scopes: ['admin'] },
};

function start(name: string, env: Record<string, string>, admin = false): Promise<Stack> {
  return startStack({
    name,
    inProcess: true,
    admin,
    callerAuth: { mode: 'api-key', callers: CALLERS },
    env: { LOG_LEVEL: 'info', ...env },
  });
}

async function scrape(app: NestFastifyApplication, key?: string) {
  const res = await app.inject({
    method: 'GET',
    url: '/metrics',
    headers: key ? { authorization: `Bearer ${key}` } : {},
  });
  return { status: res.statusCode, body: res.body };
}

/**
 * Which listener a scrape arrived on decides, never the target's spelling: `inject` arrives on
 * the callers' listener (its socket is not an admin connection).
 */
describe('/metrics on the callers’ listener', () => {
  describe('production (NODE_ENV=production) without ADMIN_PORT', () => {
    let stack: Stack;
    beforeAll(async () => {
      stack = await start('metrics-prod', { NODE_ENV: 'production' });
    });
    afterAll(async () => {
      await stack?.close();
    });

    it('answers 401 without a credential and 403 without scope admin on every client', async () => {
      const app = stack.brokers[0].app!;
      const anonymous = await scrape(app);
      expect(anonymous.status).toBe(401);
      expect(anonymous.body).not.toContain('token_broker_');
      const shop = await scrape(app, stack.keys.shop);
      expect(shop.status).toBe(403);
      expect(JSON.parse(shop.body)).toMatchObject({ code: 'forbidden' });
      expect(JSON.parse(shop.body).detail).toContain('scope "admin"');
      const narrow = await scrape(app, stack.keys['acme-ops']);
      expect(narrow.status).toBe(403);
      expect(JSON.parse(narrow.body).detail).toContain('every client ("*")');
    });

    it('serves an operator with scope admin on every client, and audits the read', async () => {
      const ok = await scrape(stack.brokers[0].app!, stack.keys.prometheus);
      expect(ok.status).toBe(200);
      expect(ok.body).toMatch(/^token_broker_/m);
      const audit = stack.brokers[0]
        .logs()
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .filter((l) => l.audit === 'admin' && l.action === 'metrics');
      expect(audit.map((l) => [l.caller, l.outcome])).toEqual([
        [undefined, 'unauthenticated'],
        ['shop', 'forbidden'],
        ['acme-ops', 'forbidden'],
        ['prometheus', 'ok'],
      ]);
    });
  });

  it('production with ADMIN_PORT: open on the admin listener, 404 on the callers’ listener', async () => {
    const stack = await start('metrics-prod-admin', { NODE_ENV: 'production' }, true);
    try {
      const broker = stack.brokers[0];
      const admin = await fetch(`${broker.adminUrl!}/metrics`);
      expect(admin.status).toBe(200);
      expect(await admin.text()).toMatch(/^token_broker_/m);
      expect((await scrape(broker.app!, stack.keys.prometheus)).status).toBe(404);
    } finally {
      await stack.close();
    }
  });

  it('development (the sandbox, local runs): open without a credential', async () => {
    const stack = await start('metrics-dev', { NODE_ENV: 'development' });
    try {
      const open = await scrape(stack.brokers[0].app!);
      expect(open.status).toBe(200);
      expect(open.body).toMatch(/^token_broker_/m);
    } finally {
      await stack.close();
    }
  });
});

import Fastify, { type FastifyInstance } from 'fastify';
import { Registry } from 'prom-client';
import { HTTP_REQUESTS_METRIC, HttpRequestCounter, UNMATCHED_ROUTE } from './http-metrics.hook';

/** Value of one series in a scrape, or undefined when the series does not exist. */
function sample(scrape: string, route: string, method: string, status: number): number | undefined {
  const prefix = `${HTTP_REQUESTS_METRIC}{route="${route}",method="${method}",status="${status}"} `;
  const line = scrape.split('\n').find((l) => l.startsWith(prefix));
  return line === undefined ? undefined : Number(line.slice(prefix.length));
}

/** Every `route` label value in a scrape. */
function routes(scrape: string): string[] {
  return [...scrape.matchAll(new RegExp(`^${HTTP_REQUESTS_METRIC}\\{route="([^"]*)"`, 'gm'))].map(
    (m) => m[1],
  );
}

describe(HttpRequestCounter.name, () => {
  let fastify: FastifyInstance;
  let registry: Registry;
  let base: string;

  beforeEach(async () => {
    fastify = Fastify();
    registry = new Registry();
    // Registered before the hook, like Nest's controllers.
    fastify.get('/things/:id', async (req, reply) => {
      const { id } = req.params as { id: string };
      return id === 'missing' ? reply.code(404).send({ error: 'no such thing' }) : { id };
    });
    new HttpRequestCounter(registry).attach(fastify);
    // Registered after the hook, like `GET /token` in a provider's onModuleInit.
    fastify.get('/token', async (_req, reply) => reply.code(201).send({ ok: true }));
    // Real HTTP, as in production (and light-my-request's ESM dependencies do not load in jest).
    base = await fastify.listen({ port: 0, host: '127.0.0.1' });
  });

  afterEach(async () => {
    await fastify.close();
  });

  const get = async (path: string, method: 'GET' | 'DELETE' | 'HEAD' = 'GET') => {
    const res = await fetch(`${base}${path}`, { method });
    await res.arrayBuffer();
    return res.status;
  };

  it('labels requests with the route pattern, never the raw URL', async () => {
    for (const id of ['abc-123', 'def-456', 'abc-123'])
      expect(await get(`/things/${id}?q=zzz`)).toBe(200);
    expect(await get('/things/missing')).toBe(404);

    const text = await registry.metrics();
    expect(sample(text, '/things/:id', 'GET', 200)).toBe(3);
    expect(sample(text, '/things/:id', 'GET', 404)).toBe(1);
    expect(routes(text).sort()).toEqual(['/things/:id', '/things/:id']);
    for (const raw of ['abc-123', 'def-456', 'missing', 'zzz']) expect(text).not.toContain(raw);
  });

  it('counts routes registered before and after the hook', async () => {
    expect(await get('/token?client=acme-prod')).toBe(201);
    expect(await get('/things/x')).toBe(200);
    const text = await registry.metrics();
    expect(sample(text, '/token', 'GET', 201)).toBe(1);
    expect(sample(text, '/things/:id', 'GET', 200)).toBe(1);
    expect(text).not.toContain('acme-prod');
  });

  it(`labels requests that match no route "${UNMATCHED_ROUTE}"`, async () => {
    const probes = ['/nope', '/wp-admin/setup.php', '/.env', '/things/a/b/c', '/token/extra'];
    for (const url of probes) expect(await get(url)).toBe(404);
    expect(await get('/things/abc', 'DELETE')).toBe(404);

    const text = await registry.metrics();
    expect(sample(text, UNMATCHED_ROUTE, 'GET', 404)).toBe(probes.length);
    expect(sample(text, UNMATCHED_ROUTE, 'DELETE', 404)).toBe(1);
    expect(new Set(routes(text))).toEqual(new Set([UNMATCHED_ROUTE]));
  });

  it('keeps counts cumulative across scrapes', async () => {
    await get('/things/x');
    expect(sample(await registry.metrics(), '/things/:id', 'GET', 200)).toBe(1);
    // A scrape with nothing new must not add anything either.
    expect(sample(await registry.metrics(), '/things/:id', 'GET', 200)).toBe(1);
    await get('/things/y');
    await get('/things/z', 'HEAD');
    const text = await registry.metrics();
    expect(sample(text, '/things/:id', 'GET', 200)).toBe(2);
    expect(sample(text, '/things/:id', 'HEAD', 200)).toBe(1);
  });
});

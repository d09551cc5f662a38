import pino from 'pino';
import { Writable } from 'node:stream';
import { Counter, Registry } from 'prom-client';
import { StoreContinuityWatch } from './store-continuity.watch';
import type { StoreContinuity } from './token-store';
import { TokenStoreErrorCode, TokenStoreException } from './token-store.exception';

/**
 * A store answering the given continuity results in order, the same for every client (one node);
 * a thrown one is an outage.
 */
function scriptedStore(kind: 'redis' | 'memory', answers: Array<StoreContinuity | 'down'>) {
  return {
    kind,
    checkContinuity: jest.fn(
      async (ids: readonly string[]): Promise<ReadonlyMap<string, StoreContinuity>> => {
        const next = answers.shift() ?? 'kept';
        if (next === 'down') {
          throw new TokenStoreException(TokenStoreErrorCode.Unavailable, 'down');
        }
        return new Map(ids.map((id) => [id, next]));
      },
    ),
  };
}

function capturingLogger(): { logger: pino.Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
      done();
    },
  });
  return { logger: pino({ level: 'info' }, sink), lines };
}

/** The counter as MetricsService declares it, without Nest (unit specs do not load it). */
function newMetrics() {
  return {
    redisDataLoss: new Counter({
      name: 'token_broker_redis_data_loss_total',
      help: 'test',
      labelNames: ['kind'] as const,
      registers: [new Registry()],
    }),
  };
}

async function lossCount(metrics: ReturnType<typeof newMetrics>, kind: string): Promise<number> {
  const data = await metrics.redisDataLoss.get();
  return data.values.filter((v) => v.labels.kind === kind).reduce((n, v) => n + v.value, 0);
}

describe(StoreContinuityWatch.name, () => {
  it('counts and logs a loss and a rollback, and nothing while the data is kept', async () => {
    const store = scriptedStore('redis', ['first', 'kept', 'lost', 'kept', 'rolled_back']);
    const metrics = newMetrics();
    const { logger, lines } = capturingLogger();
    const watch = new StoreContinuityWatch(store, ['acme'], metrics, logger, 60_000);
    for (let i = 0; i < 2; i++) await watch.check();
    expect(await lossCount(metrics, 'lost')).toBe(0);
    expect(lines).toHaveLength(0);
    await watch.check();
    expect(await lossCount(metrics, 'lost')).toBe(1);
    await watch.check();
    await watch.check();
    expect(await lossCount(metrics, 'rolled_back')).toBe(1);
    expect(lines.map((l) => [l.level, l.clients, l.continuity])).toEqual([
      [50, ['acme'], 'lost'],
      [50, ['acme'], 'rolled_back'],
    ]);
    // The log says what it means for orders, and what to fix.
    expect(String(lines[0].msg)).toMatch(/second order/);
    expect(String(lines[0].msg)).toMatch(/appendonly/);
  });

  it('shrugs off an outage (the store health reports it) and compares again after it', async () => {
    const store = scriptedStore('redis', ['first', 'down', 'lost']);
    const metrics = newMetrics();
    const watch = new StoreContinuityWatch(store, ['acme'], metrics, capturingLogger().logger, 1);
    await watch.check();
    await expect(watch.check()).resolves.toBeUndefined();
    await watch.check();
    expect(await lossCount(metrics, 'lost')).toBe(1);
  });

  it('joins a round already running, and asks once a round for every client', async () => {
    const store = scriptedStore('redis', []);
    const watch = new StoreContinuityWatch(
      store,
      ['a', 'b'],
      newMetrics(),
      capturingLogger().logger,
      60_000,
    );
    await Promise.all([watch.check(), watch.check(), watch.check()]);
    expect(store.checkContinuity).toHaveBeenCalledTimes(1);
    expect(store.checkContinuity).toHaveBeenCalledWith(['a', 'b']);
  });

  it('counts a loss for every client of the node, in one log line naming a bounded list', async () => {
    const ids = Array.from({ length: 30 }, (_, i) => `m${i}`);
    const store = scriptedStore('redis', ['first', 'lost']);
    const metrics = newMetrics();
    const { logger, lines } = capturingLogger();
    const watch = new StoreContinuityWatch(store, ids, metrics, logger, 60_000);
    await watch.check();
    await watch.check();
    expect(await lossCount(metrics, 'lost')).toBe(30);
    expect(lines).toHaveLength(1);
    expect(lines[0].clients).toHaveLength(21);
    expect((lines[0].clients as string[])[20]).toBe('... 10 more');
  });

  it('does not watch a memory store', async () => {
    const store = scriptedStore('memory', []);
    const watch = new StoreContinuityWatch(store, ['a'], newMetrics(), capturingLogger().logger, 1);
    watch.start();
    await watch.check();
    watch.stop();
    expect(store.checkContinuity).not.toHaveBeenCalled();
  });
});

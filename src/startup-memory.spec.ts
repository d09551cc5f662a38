import { getHeapSpaceStatistics } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { releaseStartupMemory } from './startup-memory';

const youngGenerationMb = () =>
  (getHeapSpaceStatistics().find((s) => s.space_name === 'new_space')?.physical_space_size ?? 0) /
  2 ** 20;

/** V8 12 (Node 22) and later know the last-resort flavor; Node 20's V8 11 ignores it. */
const knowsLastResort = Number(process.versions.v8.split('.')[0]) >= 12;

describe(releaseStartupMemory.name, () => {
  it('leaves no `gc` in the global scope, nor in contexts made afterwards', () => {
    releaseStartupMemory();
    expect(typeof (globalThis as { gc?: unknown }).gc).toBe('undefined');
    expect(runInNewContext('typeof gc')).toBe('undefined');
  });

  (knowsLastResort ? it : it.skip)('shrinks a young generation grown by surviving objects', () => {
    // Objects kept alive through several scavenges make V8 grow the young generation, as the
    // app's start-up does.
    let kept: Array<{ i: number; s: string }> | undefined = [];
    for (let i = 0; i < 400_000; i++) kept.push({ i, s: `x${i}` });
    const grown = youngGenerationMb();
    expect(kept.length).toBe(400_000);
    kept = undefined;
    releaseStartupMemory();
    expect(grown).toBeGreaterThan(4);
    expect(youngGenerationMb()).toBeLessThan(grown / 4);
  });
});

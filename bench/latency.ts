import autocannon from 'autocannon';

/** p50 and p99 of one autocannon run, in milliseconds with microsecond resolution. */
export interface Latency {
  p50Ms: number;
  p99Ms: number;
}

/**
 * Runs autocannon and takes the latency percentiles from each response's own timing.
 * autocannon's summary records whole milliseconds, so at sub-millisecond latencies its p99
 * reads 1 or 2 and a ratio of two of them is 1.0x or 2.0x, whatever the servers did.
 */
export function loadWithLatency(
  opts: autocannon.Options,
): Promise<{ result: autocannon.Result; latency: Latency }> {
  const samples: number[] = [];
  return new Promise((resolve, reject) => {
    const instance = autocannon(opts, (err: Error | null, result: autocannon.Result) => {
      if (err) reject(err);
      else resolve({ result, latency: percentiles(samples) });
    });
    // (client, status code, bytes, the response's time in ms, from process.hrtime)
    instance.on('response', (_client: unknown, statusCode: number, _b: number, ms: number) => {
      if (statusCode < 300) samples.push(ms);
    });
  });
}

function percentiles(samples: number[]): Latency {
  const sorted = Float64Array.from(samples).sort();
  const at = (q: number) => (sorted.length === 0 ? 0 : sorted[Math.ceil(q * sorted.length) - 1]);
  return { p50Ms: at(0.5), p99Ms: at(0.99) };
}

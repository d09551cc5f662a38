import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

type GarbageCollector = (options: {
  type: 'major';
  execution: 'sync';
  flavor: 'last-resort';
}) => void;

/**
 * Gives back, once, the memory V8 kept from start-up (`BENCH_ONLY=replica npm run bench`). Loading
 * and wiring the app makes V8 grow its young generation to two 16 MB semi-spaces while start-up
 * objects survive scavenges, and it keeps them until its idle memory reducer runs, up to ~100 s
 * later. A last-resort full GC (what V8 runs before giving up on an allocation) collects until
 * nothing more is freed and shrinks the young generation: about -20 MB of RSS on the image's
 * Node 26, ~60 ms of one pause. Node 20's V8 does not know the `flavor` and runs a GC that gives
 * nothing back, in a few milliseconds. Not repeated: afterwards V8 sizes the young generation to
 * the traffic as usual.
 */
export function releaseStartupMemory(): void {
  // `gc` exists only in contexts created while --expose-gc is set: one made for it alone, so
  // the app's own global scope never gets a `gc`.
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as GarbageCollector;
  setFlagsFromString('--no-expose-gc');
  gc({ type: 'major', execution: 'sync', flavor: 'last-resort' });
}

/* eslint-disable @typescript-eslint/no-require-imports -- undici's files below have no types
   of their own; each value is typed as the same value of undici's index. */
type Undici = typeof import('undici');

/**
 * The part of undici the broker uses: `Agent` (with the `request` method its index adds to
 * every dispatcher) and `errors`, from undici's own files rather than its index. The index also
 * loads fetch, WebSocket, EventSource, the caches and the mocks (~110 files), and its cookies
 * module reads `globalThis.Headers`, which makes Node load its internal copy of undici as well:
 * together about -6 MB of RSS and -50 ms of CPU at start (measured with `npm run bench`). The
 * classes are the index's very classes (the same files), so `instanceof` and tests that use
 * the index agree.
 */
const Dispatcher = require('undici/lib/dispatcher/dispatcher') as Undici['Dispatcher'];
// What undici's index does, once, for every dispatcher: request(), stream(), pipeline()...
Object.assign(Dispatcher.prototype, require('undici/lib/api') as object);

export const Agent = require('undici/lib/dispatcher/agent') as Undici['Agent'];
export type Agent = import('undici').Agent;
export const errors = require('undici/lib/core/errors') as Undici['errors'];

import type { TokenStore } from '../../src/token/token-store';

/** A refresh lock kept until `release()`: what a replica in the middle of a refresh looks like. */
export interface HeldLock {
  release(): Promise<void>;
}

/**
 * Takes the client's refresh lock through `withRefreshLock` and keeps it (extended) until
 * `release()`; `null` when another holder has it. Rejects when taking it fails.
 */
export function holdRefreshLock(
  store: Pick<TokenStore, 'lock'>,
  clientId: string,
): Promise<HeldLock | null> {
  return new Promise((resolve, reject) => {
    let letGo!: () => void;
    const released = new Promise<void>((r) => (letGo = r));
    const done = store.lock.withRefreshLock(clientId, () => {
      resolve({
        release: async () => {
          letGo();
          await done;
        },
      });
      return released;
    });
    done.then((locked) => {
      if (!locked.acquired) resolve(null);
    }, reject);
  });
}

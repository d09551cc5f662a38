import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type { ClientConfig } from './client.schema';
import { ConfigException } from './config.exception';
import { loadConfig } from './config.loader';
import type { BrokerConfig } from './config.schema';

/** What a reload did to the client list, by id (sorted). */
export interface ClientChanges {
  added: string[];
  removed: string[];
  /** Replaced by their new configuration. */
  changed: string[];
}

export const NO_CLIENT_CHANGES: ClientChanges = { added: [], removed: [], changed: [] };

/**
 * What a reload applies without a restart: the client list, the readiness list naming them and
 * the caller grants of the file (which name them too). Every other setting changed in the file
 * waits for the next restart, and is named in a warning.
 */
const APPLIED = ['clients', 'readiness'] as const;

export type Reloaded =
  | { config: BrokerConfig; restartNeeded: string[] }
  | { error: string; cause: ConfigException };

/**
 * The configuration as the broker runs it, and the source it was read from: the environment and
 * `BROKER_CONFIG_FILE` of the process. Without a source (a broker built from a config object),
 * there is nothing to re-read and a reload keeps the running configuration.
 */
export class ConfigReloader {
  private running: BrokerConfig;

  constructor(
    initial: BrokerConfig,
    private readonly env?: Readonly<Record<string, string | undefined>>,
  ) {
    this.running = initial;
  }

  get current(): BrokerConfig {
    return this.running;
  }

  /** The file watched for changes, if the configuration came from one. */
  get fileName(): string | undefined {
    const name = this.env?.BROKER_CONFIG_FILE?.trim();
    return name === undefined || name === '' ? undefined : name;
  }

  /**
   * Re-reads and validates the whole configuration with the schema it started with. A bad file
   * is refused as a whole (the running configuration stays); a good one becomes
   * {@link current}. Never echoes a value: the message names settings, as at start-up.
   */
  reload(): Reloaded {
    if (this.env === undefined) return { config: this.running, restartNeeded: [] };
    let next: BrokerConfig;
    try {
      next = loadConfig(this.env);
    } catch (err) {
      if (!(err instanceof ConfigException)) throw err;
      return { error: err.message, cause: err };
    }
    const restartNeeded = changedSections(this.running, next);
    this.running = next;
    return { config: next, restartNeeded };
  }
}

/** Top-level settings other than those a reload applies, which differ between `a` and `b`. */
function changedSections(a: BrokerConfig, b: BrokerConfig): string[] {
  const applied = new Set<string>(APPLIED);
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  const changed: string[] = [];
  for (const key of keys) {
    if (applied.has(key)) continue;
    const left = (a as Record<string, unknown>)[key];
    const right = (b as Record<string, unknown>)[key];
    if (key === 'callerAuth') {
      // Its grants are applied; its mode and sources are not.
      if (JSON.stringify(withoutGrants(left)) !== JSON.stringify(withoutGrants(right))) {
        changed.push(key);
      }
      continue;
    }
    if (JSON.stringify(left) !== JSON.stringify(right)) changed.push(key);
  }
  return changed.sort();
}

function withoutGrants(callerAuth: unknown): unknown {
  const c = callerAuth as BrokerConfig['callerAuth'];
  return { ...c, apiKeys: undefined, kubernetes: { ...c.kubernetes, subjects: undefined } };
}

/**
 * The ids added, removed and changed from `before` to `after`. A client is changed when any of
 * its settings is; `forwardingOnly` lists those whose change touches no token setting (only
 * `baseUrl`, `ordersPath`, `forward`), whose held token may be kept.
 */
export function clientChanges(
  before: readonly ClientConfig[],
  after: readonly ClientConfig[],
): ClientChanges & { forwardingOnly: string[] } {
  const old = new Map(before.map((c) => [c.id, c]));
  const now = new Map(after.map((c) => [c.id, c]));
  const added = [...now.keys()].filter((id) => !old.has(id)).sort();
  const removed = [...old.keys()].filter((id) => !now.has(id)).sort();
  const changed: string[] = [];
  const forwardingOnly: string[] = [];
  for (const [id, next] of now) {
    const prev = old.get(id);
    if (prev === undefined || JSON.stringify(prev) === JSON.stringify(next)) continue;
    changed.push(id);
    if (JSON.stringify(tokenPart(prev)) === JSON.stringify(tokenPart(next)))
      forwardingOnly.push(id);
  }
  return { added, removed, changed: changed.sort(), forwardingOnly };
}

/** What decides the token a client is given: all but where its calls are forwarded. */
function tokenPart(client: ClientConfig): unknown {
  return { ...client, baseUrl: undefined, ordersPath: undefined, forward: undefined };
}

/**
 * Polls a file's content hash every `intervalMs` and calls `changed` when it differs from the
 * last one seen (an unreadable file is not a change: the next readable content is compared).
 * A mounted ConfigMap changes by a symlink swap, which file events miss: polling sees it.
 */
export class ConfigFileWatch {
  private timer?: NodeJS.Timeout;
  private lastHash?: string;
  private polling = false;

  constructor(
    private readonly fileName: string,
    private readonly intervalMs: number,
    private readonly changed: () => Promise<void>,
  ) {}

  async start(): Promise<void> {
    if (this.timer !== undefined || this.intervalMs <= 0) return;
    this.lastHash = await this.hash();
    this.timer = setInterval(() => void this.poll(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Also after a reload by other means: the content it applied is not a change to apply again. */
  async seen(): Promise<void> {
    this.lastHash = (await this.hash()) ?? this.lastHash;
  }

  private async poll(): Promise<void> {
    if (this.polling) return;
    this.polling = true;
    try {
      const hash = await this.hash();
      if (hash === undefined || hash === this.lastHash) return;
      this.lastHash = hash;
      await this.changed();
    } finally {
      this.polling = false;
    }
  }

  private async hash(): Promise<string | undefined> {
    try {
      return createHash('sha256')
        .update(await readFile(this.fileName))
        .digest('hex');
    } catch {
      return undefined;
    }
  }
}

/** Injection token for the {@link ConfigReloader}. */
export const CONFIG_RELOADER = 'TOKEN_BROKER:CONFIG_RELOADER';

import { setTimeout as sleep } from 'node:timers/promises';
import {
  Inject,
  Injectable,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  type OnModuleInit,
  Optional,
} from '@nestjs/common';
import type { FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { CALLER_AUTHENTICATOR, type Caller, type CallerAuthenticator } from '../caller-auth/caller';
import { authorizationOf } from '../caller-auth/bearer-credential';
import { CallerAuthErrorCode, CallerAuthException } from '../caller-auth/caller-auth.exception';
import { assertScope } from '../caller-auth/caller-authorization';
import {
  type ClientChanges,
  CONFIG_RELOADER,
  ConfigFileWatch,
  type ConfigReloader,
  NO_CLIENT_CHANGES,
} from '../config/config-reload';
import { BrokerException } from '../errors/broker.exception';
import { LOGGER } from '../logging/logger';
import { REPLICA_ID } from '../token/token-store';
import { TokenStoreException } from '../token/token-store.exception';
import { TokenService } from '../token/token.service';
import { AdminErrorCode, AdminException } from './admin.exception';
import { requestIdsOf } from '../http/request-id';

type AdminAction = 'status' | 'refresh' | 'revoke' | 'reload' | 'metrics';

/** Their effect and answer reach beyond any narrower grant than every client (`"*"`). */
const FLEET_WIDE: ReadonlySet<AdminAction> = new Set(['reload', 'metrics']);

/** How long a revoke's answer waits for the notified replicas to acknowledge. */
const ACK_WAIT_MS = 2000;
const ACK_POLL_MS = 50;
/** How long a revoke's answer waits for the replacement token, to name it. */
const REPLACEMENT_WAIT_MS = 3000;

/** One audit line per call, allowed or refused: never a token or a secret, only fingerprints. */
@Injectable()
export class AdminService implements OnModuleInit, OnApplicationBootstrap, OnApplicationShutdown {
  private readonly audit: Logger;
  /** The mounted configuration file, watched for a changed client list. */
  private readonly fileWatch?: ConfigFileWatch;

  constructor(
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    private readonly tokens: TokenService,
    @Inject(LOGGER) private readonly logger: Logger,
    @Optional() @Inject(CONFIG_RELOADER) private readonly reloader?: ConfigReloader,
  ) {
    this.audit = logger.child({ audit: 'admin' });
    const file = reloader?.fileName;
    if (file !== undefined) {
      this.fileWatch = new ConfigFileWatch(file, reloader!.current.configReloadSeconds * 1000, () =>
        this.reloadHere().then((result) =>
          this.logger.info(
            { clientList: result.clients, clients: result.credentials, callers: result.callers },
            'configuration file changed: reloaded its clients and caller grants',
          ),
        ),
      );
    }
  }

  onModuleInit(): void {
    this.tokens.fleet.onReloadRequested((from) => {
      if (from === REPLICA_ID) return;
      void this.reloadHere().then((result) =>
        this.logger.info(
          // Not `credentials`: the logger redacts any field of that name.
          {
            askedBy: from,
            clients: result.credentials,
            clientList: result.clients,
            callers: result.callers,
          },
          'reloaded credentials and caller grants at an operator request made on another replica (and the client list)',
        ),
      );
    });
  }

  async onApplicationBootstrap(): Promise<void> {
    await this.fileWatch?.start();
  }

  onApplicationShutdown(): void {
    this.fileWatch?.stop();
  }

  /** Writes the audit line either way. */
  async run<T>(
    req: FastifyRequest,
    action: AdminAction,
    clientId: string | undefined,
    work: (caller: Caller, clientId: string | undefined) => Promise<T>,
    summary: (result: T) => Record<string, unknown> = () => ({}),
  ): Promise<T> {
    let caller: Caller | undefined;
    let client: string | undefined;
    // `requestId` is the broker's own id (the line's existing name), `callerRequestId` beside it.
    const { reqId, callerRequestId } = requestIdsOf(req);
    const line = (outcome: string, reason?: string) => ({
      caller: caller?.name,
      action,
      client,
      outcome,
      reason,
      requestId: reqId,
      ...(callerRequestId !== undefined && { callerRequestId }),
    });
    try {
      caller = await this.auth.authenticate(authorizationOf(req.raw));
      assertScope(caller, 'admin');
      if (FLEET_WIDE.has(action) && caller.clients !== '*') {
        // Names only the caller: the refusal must not tell which other clients exist.
        throw new CallerAuthException(
          CallerAuthErrorCode.Forbidden,
          `caller "${caller.name}" may not ${action} the whole fleet: that needs a grant of every client ("*"); ask the platform team`,
          { audit: { reason: 'fleet_wide_needs_every_client' } },
        );
      }
      if (clientId !== undefined) client = this.tokens.resolveClient(clientId, caller);
      const result = await work(caller, client).catch(translate);
      this.audit.info({ ...line('ok'), ...summary(result) }, 'admin');
      return result;
    } catch (err) {
      const outcome = err instanceof BrokerException ? String(err.code) : 'internal_error';
      // A refused client is named in the audit line only: the answer hides whether it exists.
      const refused = err instanceof CallerAuthException ? err.audit : {};
      this.audit.warn(
        { ...line(outcome, refused.reason), client: client ?? refused.client },
        'admin',
      );
      throw err;
    }
  }

  /**
   * Waits up to {@link ACK_WAIT_MS} for the replicas it reached to acknowledge, then up to
   * {@link REPLACEMENT_WAIT_MS} for this replica's replacement token, to say whether the
   * provider granted the revoked token again (some re-issue a token until it expires).
   */
  async revoke(clientId: string) {
    const revocation = await this.tokens.fleet.revoke(clientId);
    const deadline = Date.now() + ACK_WAIT_MS;
    const acks = () => this.tokens.fleet.revocationAcks(clientId, revocation.generation);
    let acknowledged = await acks();
    while (acknowledged < revocation.delivered && Date.now() < deadline) {
      await sleep(ACK_POLL_MS);
      acknowledged = await acks();
    }
    const next = await this.tokens.replacementAfter(
      clientId,
      revocation.generation,
      REPLACEMENT_WAIT_MS,
    );
    const reissued = next !== undefined && next.fingerprint === revocation.fingerprint;
    if (reissued) {
      this.logger.warn(
        { client: clientId, fingerprint: next.fingerprint, generation: revocation.generation },
        'revoke: the provider granted the revoked token again; revoke it at the provider',
      );
    }
    return {
      client: clientId,
      generation: revocation.generation,
      revokedFingerprint: revocation.fingerprint,
      replicas: { notified: revocation.delivered, acknowledged },
      replacement:
        next === undefined
          ? null
          : {
              fingerprint: next.fingerprint,
              expiresAt: new Date(next.expiresAt).toISOString(),
              reissued,
            },
      ...(reissued && {
        warning:
          'the provider granted the revoked token again (it re-issues a token until it expires), so the fleet serves it again: revoke it at the provider to stop its use',
      }),
    };
  }

  /** Here, and every other replica asked through Redis (`notified`: subscribers, this one too). */
  async reload() {
    const [here, replicas] = await Promise.all([
      this.reloadHere(),
      this.tokens.fleet.requestReload().then(
        (notified) => ({ notified }),
        () => ({
          error:
            'the other replicas could not be asked (Redis does not answer); they reload on their own schedule, or call this route on each',
        }),
      ),
    ]);
    return { ...here, replicas };
  }

  /**
   * Re-reads the configuration and applies its client list. A bad configuration is refused as a
   * whole, logged with the reason, and the running clients stay.
   */
  private async reloadClients(): Promise<ClientChanges | { error: string }> {
    const loaded = this.reloader?.reload();
    if (loaded === undefined) return NO_CLIENT_CHANGES;
    if ('error' in loaded) {
      this.logger.error(
        { err: loaded.error },
        'the reloaded configuration is invalid; nothing of it applied, the running clients stay',
      );
      return { error: loaded.error };
    }
    if (loaded.restartNeeded.length > 0) {
      this.logger.warn(
        { settings: loaded.restartNeeded },
        'the configuration changed settings a reload does not apply; they take effect at the next restart',
      );
    }
    return this.tokens.applyClients(loaded.config);
  }

  /**
   * Names only, never a value. The client list first: the credentials and grants then read are
   * those of the clients now configured.
   */
  private async reloadHere() {
    const clients = await this.reloadClients();
    // Applied by whichever way it came: the watch must not apply the same content again.
    await this.fileWatch?.seen();
    const credentials = await this.tokens.reloadCredentials();
    const callers = await Promise.resolve(this.auth.reloadNow?.()).then(
      (changed) => changed ?? { added: [], removed: [] },
      // The reader's message may name internals; the periodic reload's log has the cause.
      () => ({
        error:
          'the caller grants could not be re-read (the API key source); the loaded ones stay in force',
      }),
    );
    return { clients, credentials, callers };
  }
}

/** A fleet-wide action without Redis is refused (503); a provider refusal names its code only. */
function translate(err: unknown): never {
  if (err instanceof TokenStoreException) {
    throw new AdminException(
      AdminErrorCode.StoreUnavailable,
      'the shared store (Redis) does not answer: a fleet-wide action needs it; check Redis, then retry',
      { cause: err, retryAfterSeconds: 2 },
    );
  }
  if (err instanceof BrokerException && err.problemStatus === undefined) {
    throw new AdminException(
      AdminErrorCode.RefreshFailed,
      `the provider did not grant a token (${String(err.code)}); see the broker's log and docs/operations.md`,
      { cause: err },
    );
  }
  throw err;
}

import { type CanActivate, type ExecutionContext, Inject, Injectable } from '@nestjs/common';
import type { FastifyRequest } from 'fastify';
import { RequestErrorCode, RequestException } from '../http/request.exception';
import {
  CALLER_AUTHENTICATOR,
  CLIENT_RESOLVER,
  type Caller,
  type CallerAuthenticator,
  type ClientResolver,
} from './caller';
import { authorizationOf } from './bearer-credential';
import type { CallerScope } from '../config/caller-auth.schema';
import { assertMayUse, assertScope } from './caller-authorization';

/** Who is calling, and for which configured client: the outcome of {@link CallerAuthGuard}. */
export interface CallerContext {
  readonly caller: Caller;
  readonly clientId: string;
}

/** What the guard learnt about a request, kept for the route's audit line even on refusal. */
interface Seen {
  caller?: Caller;
  clientId?: string;
  authorized: boolean;
}

const SEEN = new WeakMap<FastifyRequest, Seen>();

/**
 * Caller authentication for every route that acts for a client, with the same rules and order
 * of checks as `GET /token`: the `Authorization` header (401), then `?client=` resolved like the
 * token route resolves it: outside the caller's grant 403 (configured or not, so that a caller
 * cannot enumerate clients), 400 when ambiguous, 404 when granted but not configured.
 *
 * Use it on a Nest controller with `@UseGuards(CallerAuthGuard)`, or call {@link authorize} from
 * a raw Fastify `onRequest` hook, so that a request is refused before its body is read. Either
 * way {@link callerContext} gives the handler the result.
 */
@Injectable()
export class CallerAuthGuard implements CanActivate {
  constructor(
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    @Inject(CLIENT_RESOLVER) private readonly resolveClient: ClientResolver,
  ) {}

  /** As a Nest guard: for routes that call the provider for the caller (scope `forward`). */
  async canActivate(context: ExecutionContext): Promise<boolean> {
    await this.authorize(context.switchToHttp().getRequest<FastifyRequest>(), 'forward');
    return true;
  }

  /**
   * Authenticates and authorises `req` for `scope` (checked before the client, so a caller
   * without it learns nothing about clients); throws a caller-auth, token or request problem.
   *
   * @param pathClient Reads the client named in the path (`/provider/<client>/...`), which then
   *   takes the place of `?client=`, with the same checks in the same order. Called only once
   *   the caller is authenticated and holds `scope`, so its own refusals (a malformed path)
   *   come after those.
   */
  async authorize(
    req: FastifyRequest,
    scope: CallerScope,
    pathClient?: () => string,
  ): Promise<CallerContext> {
    const seen: Seen = { authorized: false };
    SEEN.set(req, seen);
    const caller = await this.auth.authenticate(authorizationOf(req.raw));
    seen.caller = caller;
    const context = this.grant(caller, pathClient ?? (() => clientParam(req.query)), scope, seen);
    seen.authorized = true;
    return context;
  }

  /**
   * The checks after authentication, in order: `scope`, then the client (read only once the
   * scope is held), then the caller's grant for it; `seen` records the client for the audit line.
   */
  private grant(
    caller: Caller,
    requestedClient: () => string | undefined,
    scope: CallerScope,
    seen?: Seen,
  ): CallerContext {
    assertScope(caller, scope);
    const clientId = this.resolveClient(requestedClient(), caller);
    if (seen) seen.clientId = clientId;
    assertMayUse(caller, clientId);
    return { caller, clientId };
  }
}

/**
 * The caller and client of a request the guard admitted; `undefined` if it did not (yet).
 * Handlers behind the guard can rely on it.
 */
export function callerContext(req: FastifyRequest): CallerContext | undefined {
  const seen = SEEN.get(req);
  return seen?.authorized && seen.caller && seen.clientId
    ? { caller: seen.caller, clientId: seen.clientId }
    : undefined;
}

/** As far as the guard got, for audit lines of refused requests: the caller once authenticated. */
export function partialCallerContext(req: FastifyRequest): Partial<CallerContext> {
  const seen = SEEN.get(req);
  return { caller: seen?.caller, clientId: seen?.clientId };
}

/** `?client=` given at most once; a repeated one is ambiguous and refused. */
function clientParam(query: unknown): string | undefined {
  const value = (query as Record<string, string | string[] | undefined> | undefined)?.client;
  if (Array.isArray(value)) {
    throw new RequestException(
      RequestErrorCode.InvalidRequest,
      'query parameter "client" is repeated; give it once',
    );
  }
  return value === '' ? undefined : value;
}

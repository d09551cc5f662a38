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

interface CallerContext {
  readonly caller: Caller;
  readonly clientId: string;
}

/** Kept for the route's audit line even on refusal. */
interface Seen {
  caller?: Caller;
  clientId?: string;
  authorized?: boolean;
}

const SEEN = new WeakMap<FastifyRequest, Seen>();

/**
 * The same rules and order as `GET /token`: 401, then `?client=` (403 outside the grant whether
 * configured or not, so clients cannot be enumerated). As a Nest guard, or {@link authorize} from
 * an `onRequest` hook, so a request is refused before its body is read.
 */
@Injectable()
export class CallerAuthGuard implements CanActivate {
  constructor(
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    @Inject(CLIENT_RESOLVER) private readonly resolveClient: ClientResolver,
  ) {}

  /** Routes that call the provider for the caller (scope `forward`). */
  async canActivate(context: ExecutionContext): Promise<boolean> {
    await this.authorize(context.switchToHttp().getRequest<FastifyRequest>(), 'forward');
    return true;
  }

  /**
   * `scope` is checked before the client, so a caller without it learns nothing about clients.
   * @param pathClient the client named in the path, in place of `?client=`; read only once the
   *   caller is authenticated and holds `scope`.
   */
  async authorize(
    req: FastifyRequest,
    scope: CallerScope,
    pathClient?: () => string,
  ): Promise<CallerContext> {
    const seen: Seen = {};
    SEEN.set(req, seen);
    const caller = await this.auth.authenticate(authorizationOf(req.raw));
    seen.caller = caller;
    assertScope(caller, scope);
    const clientId = this.resolveClient(pathClient ? pathClient() : clientParam(req.query), caller);
    seen.clientId = clientId;
    assertMayUse(caller, clientId);
    seen.authorized = true;
    return { caller, clientId };
  }
}

/** `undefined` if the guard did not admit the request (yet). */
export function callerContext(req: FastifyRequest): CallerContext | undefined {
  const seen = SEEN.get(req);
  return seen?.authorized ? { caller: seen.caller!, clientId: seen.clientId! } : undefined;
}

/** For audit lines of refused requests. */
export function partialCallerContext(req: FastifyRequest): Partial<CallerContext> {
  return SEEN.get(req) ?? {};
}

/** A repeated one is ambiguous and refused. */
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

import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { CALLER_AUTHENTICATOR, type Caller, type CallerAuthenticator } from '../caller-auth/caller';
import { authorizationOf } from '../caller-auth/bearer-credential';
import { CallerAuthErrorCode, CallerAuthException } from '../caller-auth/caller-auth.exception';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { requestIdsOf } from '../http/request-id';
import { RequestException } from '../http/request.exception';
import { OAuthErrorCode, OAuthException } from './oauth.exception';
import {
  describeMethods,
  methodsFor,
  OAUTH_BODY_LIMIT_BYTES,
  type OAuthTokenRequest,
  parseOAuthTokenRequest,
} from './oauth-token-request';
import { TOKEN_HEADERS } from './token-body';
import { TokenFront } from './token-front';
import { TokenErrorCode, TokenException } from './token.exception';
import { TokenService } from './token.service';

const OAUTH_TOKEN_PATH = '/oauth2/token';
/** RFC 8414 §3: where discovery-based clients look. */
const OAUTH_METADATA_PATH = '/.well-known/oauth-authorization-server';

interface Progress {
  request?: OAuthTokenRequest;
  caller?: Caller;
  clientId?: string;
}

/**
 * `POST /oauth2/token`: the RFC 6749 client-credentials grant over the same grants, cache and
 * audit as `GET /token`, so a stock OAuth client gets the fleet's token by changing only its
 * token URL; plus the RFC 8414 metadata. Answers are RFC 6749 §5.1/§5.2, never a problem document.
 */
@Injectable()
export class OAuthTokenRoute implements OnModuleInit {
  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly front: TokenFront,
    private readonly tokens: TokenService,
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
  ) {}

  onModuleInit(): void {
    const fastify = this.adapterHost.httpAdapter.getInstance<FastifyInstance>();
    void fastify.register(async (scope) => {
      scope.removeAllContentTypeParsers();
      // Every media type reaches the handler as text: the parser refuses a wrong one with the
      // RFC's error rather than Fastify's 415, and URLSearchParams does the form decoding.
      scope.addContentTypeParser(
        '*',
        { parseAs: 'string', bodyLimit: OAUTH_BODY_LIMIT_BYTES },
        (_req, body, done) => done(null, body),
      );
      // Body-reading failures (too large, truncated) arrive here, before the handler.
      scope.setErrorHandler((err, req, reply) =>
        this.refuse(
          new OAuthException(
            OAuthErrorCode.InvalidRequest,
            (err as { statusCode?: number }).statusCode === 413
              ? `the form is larger than ${OAUTH_BODY_LIMIT_BYTES} bytes`
              : 'the request body could not be read',
            { cause: err },
          ),
          {},
          req,
          reply,
        ),
      );
      scope.route({
        method: 'POST',
        url: OAUTH_TOKEN_PATH,
        bodyLimit: OAUTH_BODY_LIMIT_BYTES,
        handler: (req, reply) => this.handle(req, reply),
      });
    });
    fastify.route({
      method: 'GET',
      url: OAUTH_METADATA_PATH,
      // Not cacheable: without a configured issuer the document depends on the Host header,
      // and a shared cache would hand one caller's Host to every other.
      handler: (req, reply) => reply.header('cache-control', 'no-store').send(this.metadata(req)),
    });
  }

  metadata(req: FastifyRequest): Record<string, unknown> {
    const issuer = issuerFor(this.config.http, req);
    const mode = this.config.callerAuth.mode;
    // No `scopes_supported`: it would list every configured client to anyone who asks.
    return {
      issuer,
      token_endpoint: `${issuer}${OAUTH_TOKEN_PATH}`,
      grant_types_supported: ['client_credentials'],
      // No authorization endpoint: nothing is issued to a browser.
      response_types_supported: [],
      token_endpoint_auth_methods_supported: methodsFor(mode),
    };
  }

  private async handle(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    const progress: Progress = {};
    try {
      const request = parseOAuthTokenRequest(
        req.headers['content-type'],
        typeof req.body === 'string' ? req.body : '',
        authorizationOf(req.raw),
        this.config.callerAuth.mode,
      );
      progress.request = request;
      const caller = await this.auth.authenticate(request.authorization);
      progress.caller = caller;
      // The secret proved a caller; the client id must name that same caller. Same answer as a
      // wrong secret, so ids cannot be probed. (Mode none has no callers to name.)
      if (
        request.clientId !== undefined &&
        this.config.callerAuth.mode !== 'none' &&
        request.clientId !== caller.name
      ) {
        throw new CallerAuthException(
          CallerAuthErrorCode.Unauthenticated,
          'client authentication failed',
        );
      }
      // The named client, else the caller's only one, else the broker's only one.
      const only = caller.clients !== '*' && caller.clients.size === 1;
      const requested = request.target?.value ?? (only ? [...caller.clients][0] : undefined);
      const clientId = this.tokens.resolveClient(requested, caller);
      progress.clientId = clientId;
      const body = await this.front.tokenBodyFor(
        caller,
        clientId,
        requestIdsOf(req),
        request.dpop ?? {},
      );
      return reply.code(200).headers(TOKEN_HEADERS).send(body);
    } catch (err) {
      return this.refuse(err, progress, req, reply);
    }
  }

  /** Audited like a refused `GET /token`. */
  private refuse(
    err: unknown,
    progress: Progress,
    req: FastifyRequest,
    reply: FastifyReply,
  ): FastifyReply {
    const oauth = this.translate(err, progress);
    const { caller, clientId } = progress;
    const unhandled = oauth.code === OAuthErrorCode.ServerError;
    this.front.refused(err, requestIdsOf(req), caller, clientId, oauth.code, unhandled);
    const headers: Record<string, string> = { ...TOKEN_HEADERS };
    let status = 400;
    if (oauth.code === OAuthErrorCode.InvalidClient && oauth.basicChallenge) {
      status = 401;
      headers['www-authenticate'] = 'Basic realm="token-broker", charset="UTF-8"';
    } else if (oauth.code === OAuthErrorCode.TemporarilyUnavailable) {
      status = 503;
      headers['retry-after'] = String(oauth.retryAfterSeconds ?? 1);
    } else if (oauth.code === OAuthErrorCode.ServerError) {
      status = 500;
    }
    return reply
      .code(status)
      .headers(headers)
      .send(JSON.stringify({ error: oauth.code, error_description: oauth.message }));
  }

  /** Messages are the broker's own, never the upstream's. */
  private translate(err: unknown, progress: Progress): OAuthException {
    if (err instanceof OAuthException) return err;
    const method = progress.request?.method;
    const mode = this.config.callerAuth.mode;
    const [code, message, retryAfterSeconds]: OAuthError =
      err instanceof CallerAuthException
        ? callerAuthError(err, method, mode)
        : err instanceof TokenException
          ? tokenError(err, progress)
          : err instanceof RequestException
            ? [OAuthErrorCode.InvalidRequest, err.message]
            : [OAuthErrorCode.ServerError, UNEXPECTED_ERROR];
    return new OAuthException(code, message, {
      cause: err,
      retryAfterSeconds,
      // A failed Basic login, or no credential where Basic is what the broker takes.
      basicChallenge:
        code === OAuthErrorCode.InvalidClient &&
        (method === 'client_secret_basic' || (method === 'none' && mode === 'api-key')),
    });
  }
}

type OAuthError = [code: OAuthErrorCode, message: string, retryAfterSeconds?: number];

const UNEXPECTED_ERROR = `unexpected error; quote the request's x-request-id when reporting it`;

function callerAuthError(
  err: CallerAuthException,
  method: OAuthTokenRequest['method'] | undefined,
  mode: BrokerConfig['callerAuth']['mode'],
): OAuthError {
  switch (err.code) {
    case CallerAuthErrorCode.Unauthenticated:
      return [
        OAuthErrorCode.InvalidClient,
        method === 'none'
          ? `authenticate with ${describeMethods(mode)}`
          : 'client authentication failed',
      ];
    case CallerAuthErrorCode.Forbidden:
      return [OAuthErrorCode.UnauthorizedClient, err.message];
    case CallerAuthErrorCode.Unavailable:
      return [OAuthErrorCode.TemporarilyUnavailable, err.message, 2];
  }
}

function tokenError(err: TokenException, progress: Progress): OAuthError {
  switch (err.code) {
    case TokenErrorCode.UnknownClient:
      return [
        progress.request?.target?.param === 'scope'
          ? OAuthErrorCode.InvalidScope
          : OAuthErrorCode.InvalidTarget,
        err.message,
      ];
    case TokenErrorCode.ClientRequired:
      return [
        OAuthErrorCode.InvalidRequest,
        'several clients are possible: name one with resource=<client id>',
      ];
    case TokenErrorCode.DpopBound:
      return [OAuthErrorCode.UnauthorizedClient, `${err.code}: ${err.message}`];
    case TokenErrorCode.Unavailable:
    case TokenErrorCode.CredentialsRejected:
    case TokenErrorCode.CredentialsUnavailable:
    case TokenErrorCode.ShuttingDown: {
      const retry = err.retryAfterSeconds ?? err.problemStatus.retryAfterSeconds ?? 1;
      return [OAuthErrorCode.TemporarilyUnavailable, err.message, retry];
    }
  }
}

/** A Host fit to be echoed into the metadata document. */
const HOST = /^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$/;

/** Else the origin the caller used; an odd Host falls back to the listener's address. */
export function issuerFor(
  http: { issuer?: string | undefined; host: string; port: number },
  req: { protocol: string; host?: string | undefined },
): string {
  if (http.issuer !== undefined) return http.issuer;
  const given = req.host ?? '';
  const host = HOST.test(given) ? given : `${http.host}:${http.port}`;
  return `${req.protocol}://${host}`;
}

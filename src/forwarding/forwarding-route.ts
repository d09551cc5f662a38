import type {
  FastifyError,
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  RouteOptions,
} from 'fastify';

/** How a forwarding route ({@link registerForwardingRoute}) answers what Fastify refuses. */
export interface ForwardingRouteHooks {
  /** Answers an error Fastify met before the handler (body too large, bad length...). */
  refuse(err: FastifyError, req: FastifyRequest, reply: FastifyReply): FastifyReply;
}

/**
 * Registers a route that forwards to the provider (`POST /orders`, the passthrough) in its own
 * encapsulated Fastify context, for two reasons:
 * - the body must reach the provider byte for byte, so this context replaces Fastify's parsers
 *   with one that keeps the raw bytes of any media type (up to `bodyLimit`), and that parser
 *   must not apply to any other route;
 * - the route authenticates the caller in `onRequest`, so an unauthenticated or forbidden
 *   request is refused before its body is read.
 * Errors, including Fastify's own, go to `hooks.refuse`. Once the server starts closing
 * (SIGTERM), every answer of the route, forwarded or refused, carries `Connection: close`, so a
 * request still in flight does not leave its keep-alive connection holding the closing server
 * open until the grace period ends.
 */
export function registerForwardingRoute(
  fastify: FastifyInstance,
  bodyLimit: number,
  hooks: ForwardingRouteHooks,
  route: RouteOptions,
): void {
  void fastify.register(async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit }, (_req, body, done) =>
      done(null, body),
    );
    scope.setErrorHandler((err: FastifyError, req, reply) => hooks.refuse(err, req, reply));
    let closing = false;
    scope.addHook('preClose', (done) => {
      closing = true;
      done();
    });
    scope.addHook('onSend', (_req, reply, payload, done) => {
      if (closing) reply.header('connection', 'close');
      done(null, payload);
    });
    scope.route({ ...route, bodyLimit });
  });
}

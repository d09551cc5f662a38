import { Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { authorizationOf } from '../caller-auth/bearer-credential';
import { type TokenAnswer, type TokenQuery, TokenResponder } from './token-responder';
import { requestIdsOf } from '../http/request-id';

/**
 * `GET /token` on Fastify: the route for what {@link TokenFastPath} leaves to it (any other
 * spelling of the target, a query string with escapes or unknown parameters). Registered
 * directly on Fastify rather than as a Nest controller: measured on this service, Nest's
 * per-request pipeline cost ~10% of throughput.
 * Everything `GET /token` means is in {@link TokenResponder}; this only transports its answer.
 */
@Injectable()
export class TokenRoute implements OnModuleInit {
  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly responder: TokenResponder,
  ) {}

  onModuleInit(): void {
    const fastify = this.adapterHost.httpAdapter.getInstance<FastifyInstance>();
    fastify.route({
      method: 'GET',
      url: '/token',
      handler: (req, reply) => {
        const answer = this.responder.respond(
          req.query as TokenQuery,
          authorizationOf(req.raw),
          requestIdsOf(req),
          req,
        );
        return answer instanceof Promise ? answer.then((a) => send(reply, a)) : send(reply, answer);
      },
    });
  }
}

function send(reply: FastifyReply, answer: TokenAnswer): FastifyReply {
  return reply.code(answer.status).headers(answer.headers).send(answer.body);
}

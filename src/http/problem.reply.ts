import { type ArgumentsHost, Catch, type ExceptionFilter } from '@nestjs/common';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { PROBLEM_CONTENT_TYPE, toProblem } from './problem';

export function sendProblem(reply: FastifyReply, err: unknown, requestId: string): FastifyReply {
  const { problem, headers } = toProblem(err, requestId);
  if (problem.status >= 500 && problem.code === 'internal_error') {
    reply.log.error({ err }, 'unhandled error');
  }
  return reply
    .code(problem.status)
    .headers(headers)
    .header('cache-control', 'no-store')
    .type(PROBLEM_CONTENT_TYPE)
    .send(JSON.stringify(problem));
}

/** The single exception filter for Nest controllers. */
@Catch()
export class ProblemFilter implements ExceptionFilter {
  catch(exception: unknown, host: ArgumentsHost): void {
    const http = host.switchToHttp();
    sendProblem(http.getResponse<FastifyReply>(), exception, http.getRequest<FastifyRequest>().id);
  }
}

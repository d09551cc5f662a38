import { type ArgumentsHost, Catch, type ExceptionFilter } from '@nestjs/common';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { problemAnswer } from './problem';

export function sendProblem(reply: FastifyReply, err: unknown, requestId: string): FastifyReply {
  const { problem, headers, body } = problemAnswer(err, requestId);
  if (problem.status >= 500 && problem.code === 'internal_error') {
    reply.log.error({ err }, 'unhandled error');
  }
  return reply.code(problem.status).headers(headers).send(body);
}

/** The single exception filter for Nest controllers. */
@Catch()
export class ProblemFilter implements ExceptionFilter {
  catch(exception: unknown, host: ArgumentsHost): void {
    const http = host.switchToHttp();
    sendProblem(http.getResponse<FastifyReply>(), exception, http.getRequest<FastifyRequest>().id);
  }
}

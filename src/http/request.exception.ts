import { BrokerException, type ProblemStatus, type ProblemTable } from '../errors/broker.exception';

/** Found before any domain logic runs. */
export enum RequestErrorCode {
  InvalidRequest = 'invalid_request',
  NotFound = 'not_found',
  MethodNotAllowed = 'method_not_allowed',
  UnsupportedMediaType = 'unsupported_media_type',
  PayloadTooLarge = 'payload_too_large',
  /** A slow or stalled client. */
  RequestTimeout = 'request_timeout',
  /**
   * The caller closed its connection before its request arrived whole: answered to no one,
   * recorded in audit lines and metrics under nginx's 499.
   */
  ClientClosed = 'client_closed',
}

export const REQUEST_PROBLEMS: ProblemTable<RequestErrorCode> = {
  [RequestErrorCode.InvalidRequest]: { status: 400, title: 'Invalid request' },
  [RequestErrorCode.NotFound]: { status: 404, title: 'Not found' },
  [RequestErrorCode.MethodNotAllowed]: { status: 405, title: 'Method not allowed' },
  [RequestErrorCode.RequestTimeout]: { status: 408, title: 'Request timeout' },
  [RequestErrorCode.PayloadTooLarge]: { status: 413, title: 'Payload too large' },
  [RequestErrorCode.UnsupportedMediaType]: { status: 415, title: 'Unsupported media type' },
  [RequestErrorCode.ClientClosed]: { status: 499, title: 'Client closed the connection' },
};

export class RequestException extends BrokerException<RequestErrorCode> {
  override get problemStatus(): ProblemStatus {
    return REQUEST_PROBLEMS[this.code];
  }
}

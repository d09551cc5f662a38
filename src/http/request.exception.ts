import { BrokerException } from '../errors/broker.exception';

/** Problems with the request itself, found before any domain logic runs. */
export enum RequestErrorCode {
  InvalidRequest = 'invalid_request',
  NotFound = 'not_found',
  MethodNotAllowed = 'method_not_allowed',
  UnsupportedMediaType = 'unsupported_media_type',
  PayloadTooLarge = 'payload_too_large',
  /** 408: the request line, headers or body did not arrive in time (a slow or stalled client). */
  RequestTimeout = 'request_timeout',
}

export class RequestException extends BrokerException<RequestErrorCode> {}

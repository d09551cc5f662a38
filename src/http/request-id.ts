/** No spaces, quotes or controls. */
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * `reqId` is the broker's own, which no caller chooses (so none can forge an audit entry or make
 * two collide); the caller's sane `X-Request-Id` is logged beside it.
 */
export interface RequestIds {
  readonly reqId: string;
  readonly callerRequestId?: string | undefined;
}

export function newRequestId(): string {
  return crypto.randomUUID();
}

export function callerRequestIdFrom(given: string | string[] | undefined): string | undefined {
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : undefined;
}

/** The caller's own when sane (it can match answers to requests), else the broker's. */
export function echoedRequestId(ids: RequestIds): string {
  return ids.callerRequestId ?? ids.reqId;
}

export function requestIdsOf(req: {
  readonly id: string;
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
}): RequestIds {
  return { reqId: req.id, callerRequestId: callerRequestIdFrom(req.headers['x-request-id']) };
}

/** What a caller's `X-Request-Id` must look like to be kept: no spaces, quotes or controls. */
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * A request's ids: the broker's own, `reqId` in every log and audit line and in problem bodies,
 * which no caller chooses (so none can forge an audit entry or make two collide); and the
 * caller's `X-Request-Id`, when it sent a sane one, logged beside it as `callerRequestId`.
 */
export interface RequestIds {
  readonly reqId: string;
  readonly callerRequestId?: string | undefined;
}

/** A request id of the broker's own. */
export function newRequestId(): string {
  return crypto.randomUUID();
}

/** The caller's `X-Request-Id` when it looks sane, else `undefined`. */
export function callerRequestIdFrom(given: string | string[] | undefined): string | undefined {
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : undefined;
}

/**
 * The id an answer's `X-Request-Id` header carries and the provider is sent: the caller's own
 * when it sent a sane one (so it can match answers to its requests), else the broker's.
 */
export function echoedRequestId(ids: RequestIds): string {
  return ids.callerRequestId ?? ids.reqId;
}

/** The ids of a request whose broker id is `reqId` and whose headers are `headers`. */
export function requestIdsOf(req: {
  readonly id: string;
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
}): RequestIds {
  return { reqId: req.id, callerRequestId: callerRequestIdFrom(req.headers['x-request-id']) };
}

import type { IncomingHttpHeaders } from 'node:http';
import type { Attributes, Span, SpanKind, Tracer } from '@opentelemetry/api';

/**
 * The broker's own spans, through the OpenTelemetry API only, taken when tracing is turned on
 * (see `tracing.ts`), after the SDK has registered: without it (no OTEL_* variables) every
 * helper here returns its argument untouched or calls straight through.
 *
 * Spans exist only where the broker does I/O: a `GET /token` that waits (the L1 hit never gets
 * here), the refresh pass (lock, provider request, fenced write), `POST /orders`, and the
 * Secrets Manager read (the AWS SDK's own instrumentation). Redis commands and provider
 * requests become child spans through the ioredis and undici instrumentations.
 */
/** The API and the broker's tracer, once tracing is on ({@link enableSpans}). */
let otel: { api: typeof import('@opentelemetry/api'); tracer: Tracer } | undefined;

/** Handed to `fn` when spans are off: every call on it is a no-op, as on the API's own. */
const NO_SPAN: Span = {
  spanContext: () => ({ traceId: '0'.repeat(32), spanId: '0'.repeat(16), traceFlags: 0 }),
  setAttribute: () => NO_SPAN,
  setAttributes: () => NO_SPAN,
  addEvent: () => NO_SPAN,
  addLink: () => NO_SPAN,
  addLinks: () => NO_SPAN,
  setStatus: () => NO_SPAN,
  updateName: () => NO_SPAN,
  end: () => undefined,
  isRecording: () => false,
  recordException: () => undefined,
};

/** Called once the SDK has started: loads the API, and from then on the helpers create spans. */
export async function enableSpans(): Promise<void> {
  const api = await import('@opentelemetry/api');
  otel = { api, tracer: api.trace.getTracer('token-broker') };
}

export function spansEnabled(): boolean {
  return otel !== undefined;
}

/** Runs `fn` in a span that ends when it settles, recording a thrown error. */
export function inSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
  kind?: SpanKind,
): Promise<T> {
  if (otel === undefined) return fn(NO_SPAN);
  const { api, tracer } = otel;
  return tracer.startActiveSpan(
    name,
    { kind: kind ?? api.SpanKind.INTERNAL, attributes },
    async (span) => {
      try {
        return await fn(span);
      } catch (err) {
        span.recordException(err instanceof Error ? err : String(err));
        span.setStatus({ code: api.SpanStatusCode.ERROR });
        throw err;
      } finally {
        span.end();
      }
    },
  );
}

/**
 * Runs `fn` in a server span that continues the caller's trace: W3C `traceparent` and
 * `tracestate` are taken from the request headers (malformed ones start a new trace).
 */
export function inCallerSpan<T>(
  headers: IncomingHttpHeaders | undefined,
  name: string,
  attributes: Attributes,
  fn: () => Promise<T>,
): Promise<T> {
  if (otel === undefined) return fn();
  const { context, propagation, SpanKind } = otel.api;
  const parent = propagation.extract(context.active(), headers ?? {});
  return context.with(parent, () => inSpan(name, attributes, fn, SpanKind.SERVER));
}

/**
 * Runs `fn` in a span that covers only its lead-in: the span ends when `fn` calls `leave(rest)`
 * (or settles), and `rest` runs in the caller's context, beside the span rather than below it.
 * For a lock: taking it is the span; the work done while holding it is not.
 */
export function inLeadSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span, leave: <U>(rest: () => Promise<U>) => Promise<U>) => Promise<T>,
): Promise<T> {
  if (otel === undefined) return fn(NO_SPAN, (rest) => rest());
  const { api, tracer } = otel;
  const outside = api.context.active();
  return tracer.startActiveSpan(name, { attributes }, async (span) => {
    let open = true;
    const end = () => {
      if (open) span.end();
      open = false;
    };
    try {
      return await fn(span, (rest) => {
        end();
        return api.context.with(outside, rest);
      });
    } catch (err) {
      if (open) {
        span.recordException(err instanceof Error ? err : String(err));
        span.setStatus({ code: api.SpanStatusCode.ERROR });
      }
      throw err;
    } finally {
      end();
    }
  });
}

import type { IncomingHttpHeaders } from 'node:http';
import type { Attributes, Span, SpanKind, Tracer } from '@opentelemetry/api';

/**
 * The broker's own spans, through the OpenTelemetry API only; without tracing every helper calls
 * straight through. Spans exist only where the broker does I/O.
 */
let otel: { api: typeof import('@opentelemetry/api'); tracer: Tracer } | undefined;

/** Every call on it is a no-op, as on the API's own. */
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

/** Called once the SDK has started. */
export async function enableSpans(): Promise<void> {
  const api = await import('@opentelemetry/api');
  otel = { api, tracer: api.trace.getTracer('token-broker') };
}

export function spansEnabled(): boolean {
  return otel !== undefined;
}

/** Ends when `fn` settles, recording a thrown error. */
export function inSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
  kind?: SpanKind,
): Promise<T> {
  return inLeadSpan(name, attributes, (span) => fn(span), kind);
}

/** Continues the caller's W3C trace; malformed headers start a new one. */
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
 * The span covers only `fn`'s lead-in, until it calls `leave(rest)`; `rest` runs beside it. For a
 * lock: taking it is the span, the work done holding it is not.
 */
export function inLeadSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span, leave: <U>(rest: () => Promise<U>) => Promise<U>) => Promise<T>,
  kind?: SpanKind,
): Promise<T> {
  if (otel === undefined) return fn(NO_SPAN, (rest) => rest());
  const { api, tracer } = otel;
  const outside = api.context.active();
  return tracer.startActiveSpan(name, { kind, attributes }, async (span) => {
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

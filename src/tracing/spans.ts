import type { IncomingHttpHeaders } from 'node:http';
import {
  type Attributes,
  context,
  INVALID_SPAN_CONTEXT,
  propagation,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from '@opentelemetry/api';

/**
 * The broker's own spans, through the OpenTelemetry API only: without an SDK started (see
 * `tracing.ts`) the API is a no-op, and every helper here returns its argument untouched or
 * calls straight through, so a broker without tracing pays nothing.
 *
 * Spans exist only where the broker does I/O: a `GET /token` that waits (the L1 hit never gets
 * here), the refresh pass (lock, provider request, fenced write), `POST /orders`, and the
 * Secrets Manager read (the AWS SDK's own instrumentation). Redis commands and provider
 * requests become child spans through the ioredis and undici instrumentations.
 */
const tracer = trace.getTracer('token-broker');
/** Handed to `fn` when spans are off: every call on it is a no-op. */
const NO_SPAN = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

let enabled = false;

/** Called once the SDK has started: from then on the helpers create spans. */
export function enableSpans(): void {
  enabled = true;
}

export function spansEnabled(): boolean {
  return enabled;
}

/** Runs `fn` in a span that ends when it settles, recording a thrown error. */
export function inSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
  kind: SpanKind = SpanKind.INTERNAL,
): Promise<T> {
  if (!enabled) return fn(NO_SPAN);
  return tracer.startActiveSpan(name, { kind, attributes }, async (span) => {
    try {
      return await fn(span);
    } catch (err) {
      span.recordException(err instanceof Error ? err : String(err));
      span.setStatus({ code: SpanStatusCode.ERROR });
      throw err;
    } finally {
      span.end();
    }
  });
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
  if (!enabled) return fn();
  const parent = propagation.extract(context.active(), headers ?? {});
  return context.with(parent, () => inSpan(name, attributes, fn, SpanKind.SERVER));
}

import type { SpanExporter } from '@opentelemetry/sdk-trace-base';
import { outgoingUrlAttributes, redisStatement } from './span-attributes';
import { enableSpans } from './spans';

/**
 * Whether the standard OpenTelemetry variables configure a trace exporter: an OTLP endpoint
 * (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or an explicit
 * `OTEL_TRACES_EXPORTER` other than `none`; `OTEL_SDK_DISABLED=true` turns it off.
 */
export function tracesConfigured(env: NodeJS.ProcessEnv): boolean {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false;
  const exporter = env.OTEL_TRACES_EXPORTER?.trim();
  if (exporter !== undefined && exporter !== '') return exporter !== 'none';
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
}

/** The exporters the broker ships: OTLP over HTTP (protobuf or JSON) and the console. */
type ExporterKind = 'otlp-proto' | 'otlp-json' | 'console';

/**
 * Which exporter the variables ask for; throws naming the variable for one the broker does not
 * ship (gRPC, Zipkin, Jaeger), rather than silently exporting nothing.
 */
export function exporterKind(env: NodeJS.ProcessEnv): ExporterKind {
  const exporter = (env.OTEL_TRACES_EXPORTER?.trim() || 'otlp').toLowerCase();
  if (exporter === 'console') return 'console';
  if (exporter !== 'otlp') {
    throw new Error(
      `OTEL_TRACES_EXPORTER=${exporter} is not supported; use otlp (OTLP over HTTP), console or none`,
    );
  }
  const name = env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
    ? 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL'
    : 'OTEL_EXPORTER_OTLP_PROTOCOL';
  const protocol = (env[name]?.trim() || 'http/protobuf').toLowerCase();
  if (protocol === 'http/protobuf') return 'otlp-proto';
  if (protocol === 'http/json') return 'otlp-json';
  throw new Error(
    `${name}=${protocol} is not supported; use http/protobuf (the default) or http/json`,
  );
}

/**
 * Starts tracing when {@link tracesConfigured}, before the instrumented libraries (ioredis,
 * undici, the AWS SDK) are loaded; otherwise loads nothing. The OpenTelemetry packages read the
 * standard variables themselves (endpoint, headers, timeouts, `OTEL_TRACES_SAMPLER`,
 * `OTEL_BSP_*`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`); the broker picks the exporter
 * and names the service `token-broker` unless told otherwise. Traces only: metrics stay on
 * `/metrics` and logs on stdout. The tracer provider, span processor and exporters are the
 * SDK's own, not `@opentelemetry/sdk-node`, whose gRPC exporters would ship gRPC and
 * protobuf.js (and with them `@types/node`) in the image.
 *
 * Returns a shutdown that flushes pending spans, or undefined when tracing is off.
 */
export async function startTracing(
  env: NodeJS.ProcessEnv = process.env,
): Promise<(() => Promise<void>) | undefined> {
  if (!tracesConfigured(env)) return undefined;
  const kind = exporterKind(env);
  const [
    { NodeTracerProvider },
    { BatchSpanProcessor, ConsoleSpanExporter },
    { detectResources, envDetector, resourceFromAttributes },
    { registerInstrumentations },
    { UndiciInstrumentation },
    { IORedisInstrumentation },
    { AwsInstrumentation },
  ] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/sdk-trace-base'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/instrumentation'),
    import('@opentelemetry/instrumentation-undici'),
    import('@opentelemetry/instrumentation-ioredis'),
    import('@opentelemetry/instrumentation-aws-sdk'),
  ]);
  const exporter = await spanExporter(kind, ConsoleSpanExporter);
  const resource = resourceFromAttributes({ 'service.name': 'token-broker' }).merge(
    detectResources({ detectors: [envDetector] }),
  );
  const provider = new NodeTracerProvider({
    resource,
    spanProcessors: [new BatchSpanProcessor(exporter)],
  });
  provider.register();
  registerInstrumentations({
    tracerProvider: provider,
    instrumentations: [
      new UndiciInstrumentation({ startSpanHook: outgoingUrlAttributes }),
      // Only commands made inside a broker span (the refresh, orders): the health pings and
      // background checks would otherwise be a trace each, every second.
      new IORedisInstrumentation({
        requireParentSpan: true,
        dbStatementSerializer: redisStatement,
      }),
      new AwsInstrumentation(),
    ],
  });
  await enableSpans();
  return () => provider.shutdown();
}

/** The span exporter of that kind; each OTLP package is loaded only when it is chosen. */
async function spanExporter(
  kind: ExporterKind,
  ConsoleSpanExporter: new () => SpanExporter,
): Promise<SpanExporter> {
  return kind === 'console'
    ? new ConsoleSpanExporter()
    : kind === 'otlp-json'
      ? new (await import('@opentelemetry/exporter-trace-otlp-http')).OTLPTraceExporter()
      : new (await import('@opentelemetry/exporter-trace-otlp-proto')).OTLPTraceExporter();
}

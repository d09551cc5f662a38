import type { SpanExporter } from '@opentelemetry/sdk-trace-base';
import { outgoingUrlAttributes, redisStatement } from './span-attributes';
import { enableSpans } from './spans';

/** An OTLP endpoint or an explicit `OTEL_TRACES_EXPORTER` other than `none`, unless disabled. */
export function tracesConfigured(env: NodeJS.ProcessEnv): boolean {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false;
  const exporter = env.OTEL_TRACES_EXPORTER?.trim();
  if (exporter !== undefined && exporter !== '') return exporter !== 'none';
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
}

type ExporterKind = 'otlp-proto' | 'otlp-json' | 'console';

/** Throws for an exporter the broker does not ship, rather than silently exporting nothing. */
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
 * Before the instrumented libraries load; otherwise loads nothing. The SDK's own provider and
 * exporters, not `@opentelemetry/sdk-node`, whose gRPC exporters would ship gRPC and protobuf.js
 * in the image. Returns a shutdown that flushes pending spans.
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
      // Only inside a broker span: health pings would otherwise be a trace each, every second.
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

/** Each OTLP package is loaded only when chosen. */
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

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

/**
 * Starts the OpenTelemetry SDK when {@link tracesConfigured}, before the instrumented libraries
 * (ioredis, undici, the AWS SDK) are loaded; otherwise loads nothing. The SDK reads every
 * `OTEL_*` variable itself (endpoint, protocol, headers, sampler, `OTEL_SERVICE_NAME`); the
 * broker adds only its defaults: service name `token-broker`, and no metrics or logs export
 * (metrics are on `/metrics`, logs on stdout) unless asked for.
 *
 * Returns the SDK's shutdown (flushes pending spans), or undefined when tracing is off.
 */
export async function startTracing(
  env: NodeJS.ProcessEnv = process.env,
): Promise<(() => Promise<void>) | undefined> {
  if (!tracesConfigured(env)) return undefined;
  env.OTEL_SERVICE_NAME ??= 'token-broker';
  env.OTEL_METRICS_EXPORTER ??= 'none';
  env.OTEL_LOGS_EXPORTER ??= 'none';
  const [
    { NodeSDK },
    { UndiciInstrumentation },
    { IORedisInstrumentation },
    { AwsInstrumentation },
  ] = await Promise.all([
    import('@opentelemetry/sdk-node'),
    import('@opentelemetry/instrumentation-undici'),
    import('@opentelemetry/instrumentation-ioredis'),
    import('@opentelemetry/instrumentation-aws-sdk'),
  ]);
  const sdk = new NodeSDK({
    instrumentations: [
      new UndiciInstrumentation(),
      // Only commands made inside a broker span (the refresh, orders): the health pings and
      // background checks would otherwise be a trace each, every second.
      new IORedisInstrumentation({ requireParentSpan: true }),
      new AwsInstrumentation(),
    ],
  });
  sdk.start();
  enableSpans();
  return () => sdk.shutdown();
}

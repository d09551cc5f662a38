import { exporterKind, tracesConfigured } from './tracing';

describe(tracesConfigured.name, () => {
  it.each([
    [{}, false],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' }, true],
    [{ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://collector:4318/v1/traces' }, true],
    [{ OTEL_TRACES_EXPORTER: 'console' }, true],
    [{ OTEL_TRACES_EXPORTER: 'none', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' }, false],
    [{ OTEL_SDK_DISABLED: 'true', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' }, false],
    [{ OTEL_SERVICE_NAME: 'only-a-name' }, false],
  ])('%j → %s', (env, expected) => {
    expect(tracesConfigured(env)).toBe(expected);
  });
});

describe(exporterKind.name, () => {
  it('defaults to OTLP over HTTP with protobuf, as the specification does', () => {
    expect(exporterKind({})).toBe('otlp-proto');
    expect(exporterKind({ OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' })).toBe('otlp-json');
    expect(
      exporterKind({
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/protobuf',
      }),
    ).toBe('otlp-proto');
    expect(exporterKind({ OTEL_TRACES_EXPORTER: 'console' })).toBe('console');
  });

  it('names the variable of an exporter or protocol it does not ship', () => {
    expect(() => exporterKind({ OTEL_TRACES_EXPORTER: 'zipkin' })).toThrow(
      /OTEL_TRACES_EXPORTER=zipkin is not supported/,
    );
    expect(() => exporterKind({ OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' })).toThrow(
      /OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported/,
    );
    expect(() => exporterKind({ OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'grpc' })).toThrow(
      /OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc/,
    );
  });
});

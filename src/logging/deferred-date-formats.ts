/**
 * Runs `load` (an `import()` of the app) while `Intl.DateTimeFormat` builds its formatters on
 * first use rather than at construction, then restores the real constructor.
 *
 * Why: Nest's `ConsoleLogger` module creates an `Intl.DateTimeFormat` when it is imported,
 * which makes V8 load ICU's locale and calendar data: about 5 MB of resident memory per replica
 * (measured, `RssFile`), although the broker never logs through that logger (Nest's messages go
 * to pino, see `PinoNestLogger`). A formatter made during `load` behaves as the real one the
 * moment it is used; only its construction is deferred.
 */
export async function withDeferredDateFormats<T>(load: () => Promise<T>): Promise<T> {
  const Real = Intl.DateTimeFormat;
  function Deferred(...args: ConstructorParameters<typeof Intl.DateTimeFormat>) {
    let real: Intl.DateTimeFormat | undefined;
    const get = () => (real ??= new Real(...args));
    return new Proxy({} as Intl.DateTimeFormat, {
      get(_target, key) {
        const value: unknown = Reflect.get(get(), key);
        return typeof value === 'function' ? (value as () => unknown).bind(get()) : value;
      },
    });
  }
  Deferred.supportedLocalesOf = Real.supportedLocalesOf.bind(Real);
  Intl.DateTimeFormat = Deferred as unknown as typeof Intl.DateTimeFormat;
  try {
    return await load();
  } finally {
    Intl.DateTimeFormat = Real;
  }
}

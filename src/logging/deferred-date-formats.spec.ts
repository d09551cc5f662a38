import { withDeferredDateFormats } from './deferred-date-formats';

describe(withDeferredDateFormats.name, () => {
  it('defers formatters made while loading, which then format as the real ones, and restores the constructor', async () => {
    const Real = Intl.DateTimeFormat;
    const options: Intl.DateTimeFormatOptions = { dateStyle: 'medium', timeZone: 'UTC' };
    const made = await withDeferredDateFormats(() => {
      expect(Intl.DateTimeFormat).not.toBe(Real);
      return Promise.resolve(new Intl.DateTimeFormat('en-GB', options));
    });
    expect(Intl.DateTimeFormat).toBe(Real);
    const at = new Date(Date.UTC(2026, 10, 23, 18, 0));
    expect(made.format(at)).toBe(new Real('en-GB', options).format(at));
    expect(made.resolvedOptions().timeZone).toBe('UTC');
  });

  it('restores the constructor when loading fails', async () => {
    const Real = Intl.DateTimeFormat;
    await expect(withDeferredDateFormats(() => Promise.reject(new Error('boom')))).rejects.toThrow(
      'boom',
    );
    expect(Intl.DateTimeFormat).toBe(Real);
  });
});

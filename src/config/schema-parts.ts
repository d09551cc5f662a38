import { z } from 'zod';

/**
 * `value` without its trailing slashes. A loop, not `/\/+$/`: that regex backtracks over every
 * run of slashes not at the end, quadratic in a long configured URL.
 */
export function trimTrailingSlashes(value: string): string {
  let end = value.length;
  while (end > 0 && value.charCodeAt(end - 1) === 0x2f) end--;
  return value.slice(0, end);
}

function noUserinfo(url: URL): boolean {
  return url.username === '' && url.password === '';
}

/**
 * An absolute http(s) URL kept exactly as written (a token endpoint is matched verbatim).
 * Undici and the broker's own errors quote the URL they called: a password in it would reach
 * logs and problem bodies, so credentials have their own settings.
 */
export const exactHttpUrl = z
  .string()
  .refine((v) => URL.canParse(v) && /^https?:\/\/[^/]/.test(v), {
    message: 'must be an absolute http:// or https:// URL',
  })
  .refine((v) => !URL.canParse(v) || noUserinfo(new URL(v)), {
    message:
      'must not hold a user name or password ("user:password@host"); the URL is quoted in errors and logs, credentials belong in their own settings',
  });

/**
 * An absolute http(s) URL without trailing slashes: a trailing slash would produce `//api/...`
 * when joined with the provider's paths (`/api/auth/v1/oauth/token`, `/api/checkout/v1/orders`).
 */
export const httpUrl = exactHttpUrl.transform(trimTrailingSlashes);

/** A comma list from an environment variable; a file's list passes as it is. */
export const commaList = (v: unknown) =>
  typeof v === 'string'
    ? v
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s !== '')
    : v;

/** A boolean from a file (`true`) or an environment variable (`"true"`, `"1"`, `"yes"`...). */
export const flag = z.union([z.boolean(), z.stringbool()]);

export const seconds = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
export const millis = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

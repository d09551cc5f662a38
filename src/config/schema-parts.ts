import { z } from 'zod';

/** A loop, not `/\/+$/`: that regex backtracks quadratically over a long configured URL. */
export function trimTrailingSlashes(value: string): string {
  let end = value.length;
  while (end > 0 && value.charCodeAt(end - 1) === 0x2f) end--;
  return value.slice(0, end);
}

function noUserinfo(url: URL): boolean {
  return url.username === '' && url.password === '';
}

/**
 * Kept exactly as written (a token endpoint is matched verbatim). Errors quote the URL, so a
 * password in it would reach logs: credentials have their own settings.
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

/** A trailing slash would produce `//api/...` when joined with the provider's paths. */
export const httpUrl = exactHttpUrl.transform(trimTrailingSlashes);

/** From an environment variable; a file's list passes as it is. */
export const commaList = (v: unknown) =>
  typeof v === 'string'
    ? v
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s !== '')
    : v;

/** A boolean from a file (`true`) or an environment variable (`"true"`, `"1"`, `"yes"`...). */
export const flag = z.union([z.boolean(), z.stringbool()]);

/** An integer from a file or an environment variable (`"300"`). */
export const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

/** Reports a custom issue at `path`, relative to the schema being refined. */
export type Issue = (path: PropertyKey[], message: string) => void;

/** The {@link Issue} reporter of a `superRefine` check. */
export function issuesOf(ctx: z.RefinementCtx): Issue {
  return (path, message) => ctx.addIssue({ code: 'custom', path, message });
}

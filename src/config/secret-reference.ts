import { z } from 'zod';

/**
 * Settings that name a secret (a Secrets Manager id, a file path) are printed in logs, errors
 * and the admin readiness report, so that an operator knows what to fix. A secret pasted into
 * one by mistake must not be printed with them: such settings are held to the shape of a
 * reference, and printed only when they also look like one.
 */

/** Secrets Manager's own rule for a name: 1-512 of these characters. */
const SECRET_NAME = /^[A-Za-z0-9/_+=.@-]{1,512}$/;
/** `arn:<partition>:secretsmanager:<region>:<account>:secret:<name>`. */
const SECRET_ARN =
  /^arn:[a-z0-9-]{1,32}:secretsmanager:[a-z0-9-]{0,32}:\d{0,12}:secret:[A-Za-z0-9/_+=.@-]{1,512}$/;
/** Printable, no quotes or braces (a JSON document or a PEM is not a path), at most PATH_MAX. */
// eslint-disable-next-line no-control-regex -- control characters are exactly what it refuses
const FILE_PATH = /^[^\x00-\x1f\x7f"'{}`\\]{1,4096}$/;

/**
 * A long run of letters and digits, or a shorter one mixing lower case, upper case and digits:
 * what a random key, a password or a token looks like and a secret's name or a path does not.
 */
function looksRandom(value: string): boolean {
  for (const run of value.match(/[A-Za-z0-9]+/g) ?? []) {
    if (run.length >= 32) return true;
    if (run.length >= 20 && /[a-z]/.test(run) && /[A-Z]/.test(run) && /\d/.test(run)) return true;
  }
  return false;
}

/** A Secrets Manager secret name or ARN. */
export const secretIdSchema = z.string().refine((v) => SECRET_NAME.test(v) || SECRET_ARN.test(v), {
  message:
    'must be a Secrets Manager secret name (1-512 letters, digits or /_+=.@-) or its ARN (arn:aws:secretsmanager:<region>:<account>:secret:<name>): it names the secret, it never holds it',
});

/** A file path. */
export const filePathSchema = z.string().refine((v) => FILE_PATH.test(v) && v.trim() === v, {
  message:
    'must be a file path (printable, no quotes, braces or backslashes, no surrounding spaces, at most 4096 characters): it names the file, it never holds its content',
});

/** The text printed in place of a reference that does not look like one. */
export const REFERENCE_NOT_SHOWN = '(not shown: does not look like a secret name or file path)';

/**
 * `reference` as it may be printed: itself when it has a reference's shape and nothing in it
 * looks like a key or a password, else {@link REFERENCE_NOT_SHOWN}.
 */
export function shownReference(reference: string): string {
  const shaped =
    SECRET_NAME.test(reference) || SECRET_ARN.test(reference) || FILE_PATH.test(reference);
  return shaped && !looksRandom(reference) ? reference : REFERENCE_NOT_SHOWN;
}

/**
 * Whether a key of a config file or secret may be printed: a short identifier, as every
 * setting name is. A secret pasted as a key (`{"<secret>": ...}`) is not one.
 */
export function looksLikeSettingName(key: string): boolean {
  return /^[A-Za-z_][A-Za-z0-9_-]{0,63}$/.test(key) && !looksRandom(key);
}

/** Where a client's credentials are read from, as a message names it. */
export function describeCredentialsSource(source: {
  secretId?: string | undefined;
  file?: string | undefined;
  privateKeyFile?: string | undefined;
  certificateFile?: string | undefined;
}): string {
  if (source.secretId !== undefined) {
    return `Secrets Manager secret "${shownReference(source.secretId)}"`;
  }
  if (source.file !== undefined) return `file "${shownReference(source.file)}"`;
  const key = source.privateKeyFile;
  if (key === undefined) return 'nowhere';
  const cert = source.certificateFile;
  return cert === undefined
    ? `key file "${shownReference(key)}" (credentials.privateKeyFile)`
    : `key files "${shownReference(cert)}" (credentials.certificateFile) and "${shownReference(key)}" (credentials.privateKeyFile)`;
}
